/* Calls the wrapper of tests/c/rtld_next_wrapper.c (linked in) and says what it got. */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("%d\n", (int)getppid());
    return 0;
}
