// A/B switches read from the environment on the host (no torch, no CUDA): the launchers' rules
// (decode.h, sm90/fwd_sm90_host.h) let a variable override them for tests and benchmark runs.
#pragma once

#include <cstdlib>

namespace flash_cuda {

// Whether the environment variable `name` is set to "0" (callers that read it once per process
// keep the answer in a static).
inline bool env_is_zero(const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && value[0] == '0' && value[1] == '\0';
}

// A three-way switch (read per call): unset or empty the rule, "0" off, anything else on
// wherever possible.
enum class EnvChoice { kRule, kOff, kAll };
inline EnvChoice env_choice(const char* name) {
    const char* value = std::getenv(name);
    if (value == nullptr || value[0] == '\0') return EnvChoice::kRule;
    return value[0] == '0' && value[1] == '\0' ? EnvChoice::kOff : EnvChoice::kAll;
}

// A number switch (read per call): false when unset or empty (the rule); else true, and
// *value is the variable read as a decimal number (strtol: 0 without leading digits).
inline bool env_number(const char* name, long* value) {
    const char* text = std::getenv(name);
    if (text == nullptr || text[0] == '\0') return false;
    *value = std::strtol(text, nullptr, 10);
    return true;
}

}  // namespace flash_cuda
