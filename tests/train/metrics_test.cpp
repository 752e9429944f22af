// metrics.jsonl round trips, the progress display in both styles, and the loss
// SVG: parsed back with a small well-formedness checker written here, then
// searched for both series.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "train/metrics.h"

namespace lathe {
namespace {

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "lathe_metrics_" + name; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// ---- A minimal XML reader: enough to prove the SVG is well-formed ----------
struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::vector<XmlElement> children;
  std::string text;
};

class XmlReader {
 public:
  explicit XmlReader(std::string_view s) : s_(s) {}
  // Parses the whole document; false (with error()) if it is not well-formed.
  bool parse(XmlElement* root) {
    skip_space();
    if (s_.substr(i_, 5) == "<?xml") {
      const size_t end = s_.find("?>", i_);
      if (end == std::string_view::npos) return fail("unterminated declaration");
      i_ = end + 2;
    }
    skip_space();
    if (!element(root)) return false;
    skip_space();
    return i_ == s_.size() || fail("content after the root element");
  }
  const std::string& error() const { return error_; }

 private:
  bool fail(const std::string& why) {
    error_ = why + " at offset " + std::to_string(i_);
    return false;
  }
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool name(std::string* out) {
    const size_t start = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '_' ||
                              s_[i_] == ':' || s_[i_] == '.')) {
      ++i_;
    }
    *out = std::string(s_.substr(start, i_ - start));
    return !out->empty() || fail("expected a name");
  }
  bool entity_text(std::string_view raw, std::string* out) {
    for (size_t k = 0; k < raw.size(); ++k) {
      if (raw[k] == '<') return fail("'<' in text or attribute");
      if (raw[k] != '&') {
        *out += raw[k];
        continue;
      }
      const size_t semi = raw.find(';', k);
      if (semi == std::string_view::npos) return fail("unterminated entity");
      const std::string_view ent = raw.substr(k + 1, semi - k - 1);
      static const std::map<std::string_view, char> kEntities = {
          {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
      auto it = kEntities.find(ent);
      if (it == kEntities.end()) return fail("unknown entity &" + std::string(ent) + ";");
      *out += it->second;
      k = semi;
    }
    return true;
  }
  bool element(XmlElement* e) {
    if (i_ >= s_.size() || s_[i_] != '<') return fail("expected '<'");
    ++i_;
    if (!name(&e->name)) return false;
    while (true) {
      skip_space();
      if (i_ >= s_.size()) return fail("unterminated tag");
      if (s_.substr(i_, 2) == "/>") {
        i_ += 2;
        return true;
      }
      if (s_[i_] == '>') {
        ++i_;
        break;
      }
      std::string key, value;
      if (!name(&key)) return false;
      skip_space();
      if (i_ >= s_.size() || s_[i_] != '=') return fail("expected '=' after " + key);
      ++i_;
      skip_space();
      if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'')) return fail("unquoted attribute " + key);
      const char q = s_[i_++];
      const size_t end = s_.find(q, i_);
      if (end == std::string_view::npos) return fail("unterminated attribute " + key);
      if (!entity_text(s_.substr(i_, end - i_), &value)) return false;
      i_ = end + 1;
      if (!e->attrs.emplace(key, value).second) return fail("duplicate attribute " + key);
    }
    while (true) {  // content until the matching end tag
      const size_t lt = s_.find('<', i_);
      if (lt == std::string_view::npos) return fail("missing </" + e->name + ">");
      if (!entity_text(s_.substr(i_, lt - i_), &e->text)) return false;
      i_ = lt;
      if (s_.substr(i_, 2) == "</") {
        i_ += 2;
        std::string end_name;
        if (!name(&end_name)) return false;
        if (end_name != e->name) return fail("</" + end_name + "> closes <" + e->name + ">");
        skip_space();
        if (i_ >= s_.size() || s_[i_] != '>') return fail("bad end tag");
        ++i_;
        return true;
      }
      e->children.emplace_back();
      if (!element(&e->children.back())) return false;
    }
  }

  std::string_view s_;
  size_t i_ = 0;
  std::string error_;
};

const XmlElement* find_by_id(const XmlElement& e, const std::string& id) {
  auto it = e.attrs.find("id");
  if (it != e.attrs.end() && it->second == id) return &e;
  for (const XmlElement& c : e.children) {
    if (const XmlElement* hit = find_by_id(c, id)) return hit;
  }
  return nullptr;
}

std::vector<std::pair<double, double>> polyline_points(const XmlElement& e) {
  std::vector<std::pair<double, double>> out;
  std::istringstream in(e.attrs.at("points"));
  std::string pair;
  while (in >> pair) {
    const size_t comma = pair.find(',');
    out.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
  }
  return out;
}

TEST(XmlReader, RejectsMalformedDocuments) {  // the checker itself must be able to fail
  XmlElement e;
  EXPECT_TRUE(XmlReader("<a x=\"1\"><b/>t &amp; u</a>").parse(&e));
  for (const char* bad : {"<a><b></a>", "<a x=1/>", "<a>&nbsp;</a>", "<a x=\"<\"/>", "<a/><b/>", "<a>"}) {
    XmlElement x;
    EXPECT_FALSE(XmlReader(bad).parse(&x)) << bad;
  }
}

// ---- metrics.jsonl -------------------------------------------------------
TEST(Metrics, JsonlRoundTripsAndIsFlushedPerLine) {
  const std::string path = temp_path("rt.jsonl");
  std::vector<StepMetrics> steps;
  for (int64_t s = 1; s <= 5; ++s) {
    steps.push_back({.step = s, .loss = 2.0 / s + 0.123456789012345, .lr = 1e-4 * s / 7.0, .grad_norm = 0.3 * s,
                     .tokens = 4096 * s, .tokens_per_s = 12345.678});
  }
  steps[2].loss = NAN;  // a diverged step
  const ValMetrics val{.step = 4, .val_loss = 1.25, .perplexity = perplexity_of(1.25)};
  {
    auto w = MetricsWriter::open(path);
    ASSERT_TRUE(w.is_ok()) << w.status().message();
    for (const StepMetrics& s : steps) ASSERT_TRUE(w->write(s).is_ok());
    ASSERT_TRUE(w->write(val).is_ok());
    // Still open: every line is already on disk.
    auto mid = read_metrics(path);
    ASSERT_TRUE(mid.is_ok()) << mid.status().message();
    EXPECT_EQ(mid->train.size(), 5u);
    EXPECT_EQ(mid->val.size(), 1u);
  }
  auto back = read_metrics(path);
  ASSERT_TRUE(back.is_ok());
  ASSERT_EQ(back->train.size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepMetrics& a = steps[i];
    const StepMetrics& b = back->train[i];
    EXPECT_EQ(a.step, b.step);
    if (std::isnan(a.loss)) EXPECT_TRUE(std::isnan(b.loss));
    else EXPECT_EQ(a.loss, b.loss);  // exact: shortest round-trip text
    EXPECT_EQ(a.lr, b.lr);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.tokens_per_s, b.tokens_per_s);
  }
  EXPECT_EQ(back->val[0].step, 4);
  EXPECT_EQ(back->val[0].val_loss, 1.25);
  EXPECT_DOUBLE_EQ(back->val[0].perplexity, std::exp(1.25));
  const std::string text = slurp(path);
  EXPECT_NE(text.find("\"loss\":null"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 6);
  {  // append mode keeps what is there
    auto w = MetricsWriter::open(path, /*append=*/true);
    ASSERT_TRUE(w.is_ok());
    ASSERT_TRUE(w->write(StepMetrics{.step = 6, .loss = 0.5}).is_ok());
  }
  EXPECT_EQ(read_metrics(path)->train.size(), 6u);
  std::remove(path.c_str());
}

TEST(Metrics, TornLastLineIsIgnoredOtherBadLinesAreErrors) {
  const std::string good = "{\"step\":1,\"loss\":2.0,\"lr\":0.001,\"grad_norm\":1.0,\"tokens\":10,\"tokens_per_s\":5.0}\n";
  auto torn = parse_metrics(good + "{\"step\":2,\"lo", "m.jsonl");
  ASSERT_TRUE(torn.is_ok());
  EXPECT_EQ(torn->train.size(), 1u);
  auto bad = parse_metrics(good + "{\"step\":2,\"lo\n" + good, "m.jsonl");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("m.jsonl:2"), std::string::npos) << bad.status().message();
  auto odd = parse_metrics("{\"step\":1}\n", "m.jsonl");
  EXPECT_NE(odd.status().message().find("neither"), std::string::npos);
  auto typed = parse_metrics("{\"step\":\"one\",\"val_loss\":1,\"perplexity\":2}\n", "m.jsonl");
  EXPECT_NE(typed.status().message().find("\"step\""), std::string::npos);
  EXPECT_EQ(read_metrics(temp_path("missing.jsonl")).status().code(), StatusCode::kIoError);
  EXPECT_EQ(MetricsWriter::open("/nonexistent-dir/m.jsonl").status().code(), StatusCode::kIoError);
}

// ---- progress ------------------------------------------------------------
TEST(Progress, LineFormatsFitTheWidth) {
  const StepMetrics m{.step = 25, .loss = 1.23456, .lr = 2e-4, .tokens_per_s = 15300};
  const std::string bar = format_progress_line(m, 100, 90.0, true, 100);
  EXPECT_LE(bar.size(), 100u);
  EXPECT_EQ(bar.front(), '[');
  EXPECT_NE(bar.find("25/100"), std::string::npos) << bar;
  EXPECT_NE(bar.find("loss 1.2346"), std::string::npos) << bar;
  EXPECT_NE(bar.find("lr 2.00e-04"), std::string::npos) << bar;
  EXPECT_NE(bar.find("15.3k tok/s"), std::string::npos) << bar;
  EXPECT_NE(bar.find("ETA 01:30"), std::string::npos) << bar;
  const size_t hashes = std::count(bar.begin(), bar.end(), '#');
  const size_t cells = bar.find(']') - 1;
  EXPECT_EQ(hashes, cells / 4);  // 25 %
  const std::string narrow = format_progress_line(m, 100, 90.0, true, 40);
  EXPECT_LE(narrow.size(), 40u);
  EXPECT_NE(narrow.front(), '[');  // no room for a bar
  EXPECT_EQ(format_duration(3725), "1:02:05");
  EXPECT_EQ(format_duration(-1), "--:--");
  EXPECT_EQ(format_progress_line(m, 100, -1, false, 0).rfind("step 25/100", 0), 0u);
}

TEST(Progress, PlainLinesComeEveryNStepsAndBarRedrawsInPlace) {
  for (ProgressStyle style : {ProgressStyle::kLines, ProgressStyle::kBar, ProgressStyle::kAuto}) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    ProgressBar bar({.total_steps = 25, .style = style, .print_every_n_steps = 10, .out = f});
    EXPECT_EQ(bar.is_bar(), style == ProgressStyle::kBar);  // a tmpfile is no terminal
    for (int64_t s = 1; s <= 25; ++s) {
      bar.update({.step = s, .loss = 1.0, .lr = 1e-4, .tokens_per_s = 100});
      if (s == 20) bar.message("validation: val_loss 0.9");
    }
    bar.finish();
    bar.finish();
    std::rewind(f);
    std::string out;
    for (int c; (c = std::fgetc(f)) != EOF;) out += static_cast<char>(c);
    std::fclose(f);
    if (style == ProgressStyle::kBar) {
      EXPECT_EQ(std::count(out.begin(), out.end(), '\r'), 26);  // 25 draws + 1 before the message
      EXPECT_NE(out.find("\r\x1b[Kvalidation: val_loss 0.9\n["), std::string::npos);
      EXPECT_EQ(out.back(), '\n');
      EXPECT_NE(out.find("25/25"), std::string::npos);
    } else {
      EXPECT_EQ(out.find('\r'), std::string::npos);
      // Steps 1 (first), 10, 20, 25 (last), plus the message.
      EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 5) << out;
      for (const char* s : {"step 1/25", "step 10/25", "step 20/25", "step 25/25"}) {
        EXPECT_NE(out.find(s), std::string::npos) << s;
      }
    }
  }
}

// ---- loss SVG ------------------------------------------------------------
TEST(LossPlot, SvgIsWellFormedAndHoldsBothSeries) {
  MetricsLog log;
  for (int64_t s = 1; s <= 300; ++s) {
    log.train.push_back({.step = s, .loss = 3.0 * std::exp(-s / 80.0) + 0.5});
  }
  log.train[10].loss = NAN;  // skipped, not drawn as a gap into nowhere
  for (int64_t s = 30; s <= 300; s += 30) log.val.push_back({.step = s, .val_loss = 3.2 * std::exp(-s / 90.0) + 0.6});
  const std::string svg = render_loss_svg(log, {.width = 640, .height = 400, .title = "run <A&B>"});
  XmlElement root;
  XmlReader reader(svg);
  ASSERT_TRUE(reader.parse(&root)) << reader.error();
  EXPECT_EQ(root.name, "svg");
  EXPECT_EQ(root.attrs.at("xmlns"), "http://www.w3.org/2000/svg");
  const XmlElement* train = find_by_id(root, "train-loss");
  const XmlElement* val = find_by_id(root, "val-loss");
  ASSERT_NE(train, nullptr);
  ASSERT_NE(val, nullptr);
  EXPECT_EQ(train->name, "polyline");
  const auto tp = polyline_points(*train);
  const auto vp = polyline_points(*val);
  EXPECT_EQ(tp.size(), 299u);
  EXPECT_EQ(vp.size(), 10u);
  for (const auto* pts : {&tp, &vp}) {
    for (auto [x, y] : *pts) {
      EXPECT_TRUE(x >= 0 && x <= 640 && y >= 0 && y <= 400) << x << "," << y;
    }
  }
  for (size_t i = 1; i < tp.size(); ++i) {
    EXPECT_GT(tp[i].first, tp[i - 1].first);   // steps run left to right
    EXPECT_GE(tp[i].second, tp[i - 1].second);  // falling loss: y grows downward
  }
  EXPECT_EQ(find_by_id(root, "val-loss-points")->children.size(), 10u);
  ASSERT_NE(find_by_id(root, "legend"), nullptr);
  EXPECT_NE(svg.find("run &lt;A&amp;B&gt;"), std::string::npos);
  EXPECT_NE(svg.find(">300<"), std::string::npos);  // an x tick at the last step
}

TEST(LossPlot, EmptyAndSinglePointLogsStillRender) {
  for (const MetricsLog& log : {MetricsLog{}, MetricsLog{.train = {{.step = 1, .loss = 2.0}}, .val = {}}}) {
    XmlElement root;
    const std::string svg = render_loss_svg(log);
    XmlReader reader(svg);
    ASSERT_TRUE(reader.parse(&root)) << reader.error();
  }
  EXPECT_NE(render_loss_svg(MetricsLog{}).find("no data"), std::string::npos);
}

TEST(LossPlot, WritesFromMetricsFile) {
  const std::string jsonl = temp_path("plot.jsonl"), svg = temp_path("plot.svg");
  {
    auto w = MetricsWriter::open(jsonl);
    ASSERT_TRUE(w.is_ok());
    for (int64_t s = 1; s <= 3; ++s) ASSERT_TRUE(w->write(StepMetrics{.step = s, .loss = 1.0 / s}).is_ok());
    ASSERT_TRUE(w->write(ValMetrics{.step = 3, .val_loss = 0.4, .perplexity = perplexity_of(0.4)}).is_ok());
  }
  ASSERT_TRUE(write_loss_svg(jsonl, svg).is_ok());
  XmlElement root;
  const std::string text = slurp(svg);
  XmlReader reader(text);
  ASSERT_TRUE(reader.parse(&root)) << reader.error();
  EXPECT_EQ(polyline_points(*find_by_id(root, "train-loss")).size(), 3u);
  EXPECT_EQ(polyline_points(*find_by_id(root, "val-loss")).size(), 1u);
  EXPECT_EQ(write_loss_svg(temp_path("nope.jsonl"), svg).code(), StatusCode::kIoError);
  std::remove(jsonl.c_str());
  std::remove(svg.c_str());
}

}  // namespace
}  // namespace lathe
