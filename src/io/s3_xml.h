// The little XML the S3 API speaks: flat documents whose few interesting
// elements (Key, Size, Prefix, UploadId, ETag, Code, Message) never nest in
// themselves. A scanner for named elements is all the client needs, and it
// answers "absent" rather than failing on anything it does not understand.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lathe {

// The inner text of every <tag ...>...</tag> in doc, in order, still escaped.
// An empty element (<tag/>) gives "".
std::vector<std::string_view> xml_elements(std::string_view doc, std::string_view tag);
// The first such element's text, unescaped; "" when absent.
std::string xml_text(std::string_view doc, std::string_view tag);

// Entities and character references (&amp; &lt; &gt; &quot; &apos; &#N; &#xH;).
std::string xml_unescape(std::string_view s);
std::string xml_escape(std::string_view s);

}  // namespace lathe
