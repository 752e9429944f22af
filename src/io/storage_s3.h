// S3 storage with explicit options, for callers that do not take them from
// the environment (tests, benchmarks). open_storage("s3://...") reads them
// from the environment instead (core/env.h).
#pragma once

#include <memory>
#include <string>

#include "io/s3_client.h"
#include "io/storage.h"

namespace lathe {

// url: "s3://bucket" or "s3://bucket/prefix". Checks at once that the bucket
// answers with these credentials (one listing request), so a wrong bucket or
// key fails when a run starts, not at its first save.
Result<std::unique_ptr<Storage>> open_s3_storage(const std::string& url, S3Options options);

// Splits "s3://bucket/a/b/" into bucket "bucket" and prefix "a/b".
Status parse_s3_url(const std::string& url, std::string* bucket, std::string* prefix);

}  // namespace lathe
