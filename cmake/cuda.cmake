# The CUDA backend is built whenever nvcc is found (LATHE_CUDA=AUTO), for
# Hopper (sm_90a) and Ampere (sm_80). Without it the backend target still
# exists and reports "no CUDA in this build" at run time.
set(LATHE_HAVE_CUDA OFF)
if(NOT LATHE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90a 80)
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 switch (and takes the CUDA
    # standard from CXX_STANDARD = 20): teach it the flag.
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    find_package(CUDAToolkit REQUIRED)
    set(LATHE_HAVE_CUDA ON)
  elseif(LATHE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LATHE_CUDA=ON but no nvcc was found")
  endif()
endif()
message(STATUS "lathe: CUDA backend ${LATHE_HAVE_CUDA}")
