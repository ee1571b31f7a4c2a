/* Placeholder replaced by the simulator workload. */
int main(void) { return 0; }
