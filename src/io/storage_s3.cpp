// S3 storage: not built yet in this tree; every call answers with an error.
#include "io/storage.h"

namespace lathe {

Result<std::unique_ptr<Storage>> open_s3_storage(const std::string& url) {
  return unsupported("storage: ", url, ": S3 storage is not available in this build");
}

}  // namespace lathe
