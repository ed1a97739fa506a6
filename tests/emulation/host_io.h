// Host-side helpers of the emulator programs (fwd_emulated.cpp, bwd_emulated.cpp): file I/O,
// output buffers with guard zones (to catch out-of-bounds writes), and 16-byte aligned inputs
// registered with the emulator as readable.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace emu_host {

std::vector<unsigned char> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return {};
    return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}

void write_file(const std::string& path, const void* data, size_t bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

constexpr size_t kGuardBytes = 4096;
constexpr unsigned char kGuardByte = 0xA5;

// A buffer with guard zones on both sides (to catch out-of-bounds writes).
struct GuardedBuffer {
    std::vector<unsigned char> bytes;
    size_t size;
    explicit GuardedBuffer(size_t n, unsigned char fill) : bytes(n + 2 * kGuardBytes + 16, kGuardByte), size(n) {
        std::fill(data(), data() + n, fill);
    }
    unsigned char* data() {
        // 16-byte aligned start after the front guard.
        auto p = reinterpret_cast<uintptr_t>(bytes.data() + kGuardBytes);
        return reinterpret_cast<unsigned char*>((p + 15) & ~uintptr_t(15));
    }
    bool guards_intact() {
        unsigned char* d = data();
        for (unsigned char* p = bytes.data(); p < d; ++p) if (*p != kGuardByte) return false;
        for (unsigned char* p = d + size; p < bytes.data() + bytes.size(); ++p) if (*p != kGuardByte) return false;
        return true;
    }
};

// Input storage, 16-byte aligned, registered as readable.
struct Input {
    std::vector<unsigned char> raw;
    unsigned char* data = nullptr;
    size_t size = 0;
    bool load(const std::string& path) {
        if (!std::ifstream(path)) return false;
        std::vector<unsigned char> file = read_file(path);
        raw.assign(file.size() + 16, 0);
        auto p = reinterpret_cast<uintptr_t>(raw.data());
        data = reinterpret_cast<unsigned char*>((p + 15) & ~uintptr_t(15));
        std::memcpy(data, file.data(), file.size());
        size = file.size();
        emu::readable_ranges().push_back({data, size});
        return true;
    }
};

// CASE_DIR/params.txt as a map of "key value" lines.
inline std::map<std::string, std::string> read_params(const std::string& dir) {
    std::map<std::string, std::string> kv;
    std::ifstream f(dir + "/params.txt");
    std::string key, value;
    while (f >> key >> value) kv[key] = value;
    return kv;
}

}  // namespace emu_host
