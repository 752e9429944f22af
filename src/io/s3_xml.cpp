// Scanning S3's XML replies for named elements (see s3_xml.h).
#include "io/s3_xml.h"

#include <cstdlib>

namespace lathe {

namespace {

bool name_ends(char c) { return c == '>' || c == '/' || c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

void append_utf8(std::string& out, unsigned long cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x110000) {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

std::vector<std::string_view> xml_elements(std::string_view doc, std::string_view tag) {
  std::vector<std::string_view> out;
  const std::string open = "<" + std::string(tag);
  const std::string close = "</" + std::string(tag) + ">";
  size_t pos = 0;
  while ((pos = doc.find(open, pos)) != std::string_view::npos) {
    size_t after = pos + open.size();
    if (after >= doc.size() || !name_ends(doc[after])) {
      pos = after;
      continue;
    }
    size_t gt = doc.find('>', after);
    if (gt == std::string_view::npos) break;
    if (doc[gt - 1] == '/') {  // <tag/>
      out.emplace_back();
      pos = gt + 1;
      continue;
    }
    size_t end = doc.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    out.push_back(doc.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return out;
}

std::string xml_text(std::string_view doc, std::string_view tag) {
  std::vector<std::string_view> all = xml_elements(doc, tag);
  return all.empty() ? std::string() : xml_unescape(all.front());
}

std::string xml_unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    size_t semi = s[i] == '&' ? s.find(';', i) : std::string_view::npos;
    if (semi == std::string_view::npos || semi - i > 10) {
      out += s[i];
      continue;
    }
    std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp") out += '&';
    else if (ent == "lt") out += '<';
    else if (ent == "gt") out += '>';
    else if (ent == "quot") out += '"';
    else if (ent == "apos") out += '\'';
    else if (ent.size() > 1 && ent[0] == '#') {
      std::string num(ent.substr(1));
      bool hex = !num.empty() && (num[0] == 'x' || num[0] == 'X');
      unsigned long cp = std::strtoul(num.c_str() + (hex ? 1 : 0), nullptr, hex ? 16 : 10);
      append_utf8(out, cp);
    } else {
      out += s[i];
      continue;
    }
    i = semi;
  }
  return out;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace lathe
