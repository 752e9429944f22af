// Loss curves as a self-contained SVG (see metrics.h). Plain geometry: a plot
// box inside fixed margins, "nice" tick steps (1, 2 or 5 times a power of
// ten), one polyline per series, and the legend in the top-right corner.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "io/s3_xml.h"
#include "train/metrics.h"

namespace lathe {
namespace {

constexpr double kLeft = 70, kRight = 20, kTop = 40, kBottom = 50;  // margins, px
constexpr const char* kTrainColor = "#1f77b4";
constexpr const char* kValColor = "#ff7f0e";
constexpr size_t kMaxPolylinePoints = 4000;  // longer series are thinned
constexpr size_t kMaxMarkers = 200;

struct Point {
  double x, y;
};

struct Range {
  double lo, hi;
};


std::string num(double v) {  // coordinates: two decimals are plenty
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

Range span_of(const std::vector<Point>& a, const std::vector<Point>& b, bool use_x) {
  Range r{INFINITY, -INFINITY};
  for (const auto* v : {&a, &b}) {
    for (const Point& p : *v) {
      const double x = use_x ? p.x : p.y;
      r.lo = std::min(r.lo, x);
      r.hi = std::max(r.hi, x);
    }
  }
  if (!(r.lo <= r.hi)) return {0.0, 1.0};  // no points
  if (r.hi - r.lo < 1e-12 * std::max(1.0, std::abs(r.hi))) {
    const double pad = std::max(std::abs(r.hi) * 0.1, 0.5);
    return {r.lo - pad, r.hi + pad};
  }
  return r;
}

double nice_step(double raw) {
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * mag;
}

std::string tick_label(double v, double step) {
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, std::abs(v) < step * 1e-6 ? 0.0 : v);
  return buf;
}

struct Frame {
  double w, h;
  Range xr, yr;
  double px(double x) const { return kLeft + (x - xr.lo) / (xr.hi - xr.lo) * (w - kLeft - kRight); }
  double py(double y) const { return h - kBottom - (y - yr.lo) / (yr.hi - yr.lo) * (h - kTop - kBottom); }
};

// Grid lines, tick marks and labels for one axis.
void draw_axis_ticks(const Frame& f, bool x_axis, double min_step, std::string* out) {
  const Range r = x_axis ? f.xr : f.yr;
  const double step = std::max(nice_step((r.hi - r.lo) / 6.0), min_step);
  for (double k = std::ceil(r.lo / step); k * step <= r.hi + step * 1e-9; k += 1.0) {
    const double v = k * step;
    const std::string label = tick_label(v, step);
    if (x_axis) {
      const std::string x = num(f.px(v));
      *out += "<line class=\"grid\" x1=\"" + x + "\" y1=\"" + num(kTop) + "\" x2=\"" + x + "\" y2=\"" +
              num(f.h - kBottom) + "\"/>\n";
      *out += "<text class=\"tick\" x=\"" + x + "\" y=\"" + num(f.h - kBottom + 18) +
              "\" text-anchor=\"middle\">" + label + "</text>\n";
    } else {
      const std::string y = num(f.py(v));
      *out += "<line class=\"grid\" x1=\"" + num(kLeft) + "\" y1=\"" + y + "\" x2=\"" + num(f.w - kRight) +
              "\" y2=\"" + y + "\"/>\n";
      *out += "<text class=\"tick\" x=\"" + num(kLeft - 8) + "\" y=\"" + num(f.py(v) + 4) +
              "\" text-anchor=\"end\">" + label + "</text>\n";
    }
  }
}

void draw_series(const Frame& f, const std::vector<Point>& pts, const char* id, const char* color, bool markers,
                 std::string* out) {
  if (pts.empty()) return;
  const size_t stride = (pts.size() + kMaxPolylinePoints - 1) / kMaxPolylinePoints;
  std::string points;
  auto add = [&](const Point& p) {
    if (!points.empty()) points += ' ';
    points.append(num(f.px(p.x))).append(",").append(num(f.py(p.y)));
  };
  for (size_t i = 0; i + 1 < pts.size(); i += stride) add(pts[i]);
  add(pts.back());  // always end on the last point
  *out += std::string("<polyline id=\"") + id + "\" fill=\"none\" stroke=\"" + color +
          "\" stroke-width=\"1.8\" points=\"" + points + "\"/>\n";
  if (!markers || pts.size() > kMaxMarkers) return;
  *out += std::string("<g id=\"") + id + "-points\" fill=\"" + color + "\">\n";
  for (const Point& p : pts) *out += "<circle cx=\"" + num(f.px(p.x)) + "\" cy=\"" + num(f.py(p.y)) + "\" r=\"3\"/>\n";
  *out += "</g>\n";
}

void draw_legend(const Frame& f, bool has_train, bool has_val, std::string* out) {
  const double x = f.w - kRight - 150, y = kTop + 10;
  *out += "<g id=\"legend\">\n<rect x=\"" + num(x) + "\" y=\"" + num(y) +
          "\" width=\"140\" height=\"48\" fill=\"white\" stroke=\"#999\"/>\n";
  const char* names[] = {"training loss", "validation loss"};
  const char* colors[] = {kTrainColor, kValColor};
  const bool present[] = {has_train, has_val};
  for (int i = 0; i < 2; ++i) {
    const double ly = y + 16 + 18 * i;
    *out += std::string("<line x1=\"") + num(x + 8) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(x + 32) + "\" y2=\"" +
            num(ly) + "\" stroke=\"" + colors[i] + "\" stroke-width=\"2.5\"" +
            (present[i] ? "" : " stroke-dasharray=\"2,3\"") + "/>\n";
    *out += "<text x=\"" + num(x + 40) + "\" y=\"" + num(ly + 4) + "\">" + names[i] + "</text>\n";
  }
  *out += "</g>\n";
}

}  // namespace

std::string render_loss_svg(const MetricsLog& log, const LossPlotOptions& options) {
  std::vector<Point> train, val;
  for (const StepMetrics& s : log.train) {
    if (std::isfinite(s.loss)) train.push_back({static_cast<double>(s.step), s.loss});
  }
  for (const ValMetrics& v : log.val) {
    if (std::isfinite(v.val_loss)) val.push_back({static_cast<double>(v.step), v.val_loss});
  }
  const double w = std::max(options.width, 240), h = std::max(options.height, 160);
  Frame f{w, h, span_of(train, val, true), span_of(train, val, false)};
  const double ypad = 0.05 * (f.yr.hi - f.yr.lo);
  f.yr = {f.yr.lo - ypad, f.yr.hi + ypad};

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(w) + "\" height=\"" + num(h) +
         "\" viewBox=\"0 0 " + num(w) + " " + num(h) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out += "<style>.grid{stroke:#e5e5e5;stroke-width:1}.axis{stroke:#333;stroke-width:1.2}"
         ".tick{fill:#333}</style>\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out += "<text x=\"" + num(w / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">" +
         xml_escape(options.title) + "</text>\n";
  draw_axis_ticks(f, true, 1.0, &out);  // steps are integers
  draw_axis_ticks(f, false, 0.0, &out);
  out += "<line class=\"axis\" x1=\"" + num(kLeft) + "\" y1=\"" + num(h - kBottom) + "\" x2=\"" + num(w - kRight) +
         "\" y2=\"" + num(h - kBottom) + "\"/>\n";
  out += "<line class=\"axis\" x1=\"" + num(kLeft) + "\" y1=\"" + num(kTop) + "\" x2=\"" + num(kLeft) + "\" y2=\"" +
         num(h - kBottom) + "\"/>\n";
  out += "<text x=\"" + num((kLeft + w - kRight) / 2) + "\" y=\"" + num(h - 12) +
         "\" text-anchor=\"middle\">step</text>\n";
  out += "<text x=\"16\" y=\"" + num((kTop + h - kBottom) / 2) + "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " +
         num((kTop + h - kBottom) / 2) + ")\">loss</text>\n";
  if (train.empty() && val.empty()) {
    out += "<text x=\"" + num(w / 2) + "\" y=\"" + num(h / 2) + "\" text-anchor=\"middle\">no data</text>\n";
  }
  draw_series(f, train, "train-loss", kTrainColor, false, &out);
  draw_series(f, val, "val-loss", kValColor, true, &out);
  draw_legend(f, !train.empty(), !val.empty(), &out);
  out += "</svg>\n";
  return out;
}

Status write_loss_svg(const std::string& metrics_path, const std::string& svg_path, const LossPlotOptions& options) {
  LATHE_ASSIGN_OR_RETURN(MetricsLog log, read_metrics(metrics_path));
  std::ofstream f(svg_path, std::ios::binary | std::ios::trunc);
  if (!f) return io_error("loss plot: cannot create ", svg_path);
  f << render_loss_svg(log, options);
  f.flush();
  if (!f) return io_error("loss plot: cannot write ", svg_path);
  return Status::ok();
}

}  // namespace lathe
