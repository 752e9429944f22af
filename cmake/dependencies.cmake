# Every dependency comes from Debian's archive (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(yaml-cpp REQUIRED)  # training recipes (lathe_train only)
# Link yaml-cpp statically when Debian's archive is there, so the binary runs
# on machines without the shared library (the GPU machine has none).
find_library(LATHE_YAML_CPP_STATIC NAMES libyaml-cpp.a)
if(LATHE_YAML_CPP_STATIC)
  set(LATHE_YAML_CPP ${LATHE_YAML_CPP_STATIC})
else()
  set(LATHE_YAML_CPP yaml-cpp)
endif()
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(ICU REQUIRED COMPONENTS uc)  # Unicode normalization (NFC) for tokenizers
# S3 storage (lathe_io): HTTP through libcurl, SHA-256/HMAC/MD5 from OpenSSL.
# Both stay ordinary shared libraries; every machine lathe runs on has them.
find_package(CURL REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include REQUIRED)
