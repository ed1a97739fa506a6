// The one place where runtime values become template parameters.
//
//   BOOL_SWITCH(params.softcap > 0.f, kHasSoftcap, [&] { launch<kHasSoftcap>(...); });
//
// expands to an if/else that calls the lambda with `kHasSoftcap` a `constexpr bool` (true or
// false). Every switch doubles the kernels compiled per instantiation file, so only values that
// change the inner loop are switched; the rest stay runtime values in the params struct.
#pragma once

#define BOOL_SWITCH(COND, CONST_NAME, ...)           \
    [&] {                                            \
        if (COND) {                                  \
            constexpr static bool CONST_NAME = true; \
            return __VA_ARGS__();                    \
        } else {                                     \
            constexpr static bool CONST_NAME = false;\
            return __VA_ARGS__();                    \
        }                                            \
    }()
