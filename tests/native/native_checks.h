#ifndef GLMRT_NATIVE_CHECKS_H
#define GLMRT_NATIVE_CHECKS_H

#include <stdint.h>
#include <stdio.h>

static int num_passed;
static int num_failed;

static int expect(int ok, const char *what)
{
    if (ok) {
        num_passed += 1;
    } else {
        num_failed += 1;
        fprintf(stderr, "FAILED: %s\n", what);
    }
    return ok;
}

static uint32_t next_random(uint64_t *state, uint32_t bound)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (uint32_t)((*state >> 11) % bound);
}

static int report_checks(void)
{
    printf("%d passed, %d failed\n", num_passed, num_failed);
    return num_failed == 0 ? 0 : 1;
}

#endif
