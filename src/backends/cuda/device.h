// CUDA device basics: query, RAII stream and buffer. In a build without CUDA
// every function returns an error saying so (stub.cpp), so callers need no
// #ifdef. Threads: any thread may call; a CudaStream is used by one thread.
#pragma once

#include <cstddef>
#include <string>

#include "core/status.h"

namespace lathe::cuda {

bool built_with_cuda();
// Number of visible CUDA devices; 0 without CUDA or without a GPU.
int device_count();
struct DeviceInfo {
  std::string name;
  int sm_major = 0, sm_minor = 0;
  size_t total_bytes = 0;
};
Result<DeviceInfo> device_info(int index);
// Bytes of device `index`'s memory free now (cudaMemGetInfo; creates the
// device's context when none exists yet).
Result<size_t> free_bytes(int index);

// Move-only owner of a cudaStream_t on one device.
class CudaStream {
 public:
  static Result<CudaStream> create(int device);
  CudaStream() = default;
  CudaStream(CudaStream&& o) noexcept;
  CudaStream& operator=(CudaStream&& o) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();
  void* handle() const { return stream_; }  // cudaStream_t
  Status synchronize() const;

 private:
  void* stream_ = nullptr;
  int device_ = 0;
};

// Move-only owner of device memory (cudaMalloc).
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> alloc(int device, size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  void* data() const { return ptr_; }
  size_t size_bytes() const { return bytes_; }
  Status copy_from_host(const void* src, size_t bytes, const CudaStream* stream = nullptr);
  Status copy_to_host(void* dst, size_t bytes, const CudaStream* stream = nullptr) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

// Move-only owner of page-locked host memory mapped into the device's
// address space (cudaHostAlloc, mapped and portable): the host writes it
// with plain stores, kernels read it over PCIe through device_data(). For
// big tables a step reads only a few rows of (an embedding gather).
class PinnedBuffer {
 public:
  static Result<PinnedBuffer> alloc(int device, size_t bytes);
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();
  void* data() const { return ptr_; }          // the host's address
  void* device_data() const { return dev_; }   // the same bytes as kernels address them
  size_t size_bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  void* dev_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace lathe::cuda
