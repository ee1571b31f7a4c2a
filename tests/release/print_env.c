/* Prints NAME=VALUE for each variable named on the command line that is set. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *value = getenv(argv[i]);
        if (value != NULL) {
            printf("%s=%s\n", argv[i], value);
        }
    }
    return 0;
}
