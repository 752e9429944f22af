// Local storage: not built yet in this tree; every call answers with an error.
#include "io/storage.h"

namespace lathe {

Result<std::unique_ptr<Storage>> open_local_storage(const std::string& dir) {
  return unsupported("storage: ", dir, ": local storage is not available in this build");
}

}  // namespace lathe
