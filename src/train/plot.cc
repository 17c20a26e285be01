// The SVG line plot of train/plot.h.
#include "train/plot.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

namespace dc::train {

std::string line_plot_svg(const std::string& title, const std::vector<double>& steps, const std::vector<double>& values) {
  constexpr double kW = 640, kH = 360, kPad = 48;
  double lo = 1e300, hi = -1e300;
  for (double v : values) lo = std::min(lo, v), hi = std::max(hi, v);
  if (values.empty()) lo = 0, hi = 1;
  if (hi - lo < 1e-12) hi = lo + 1;
  const double n = std::max<double>(1, steps.empty() ? 1 : steps.back());
  auto x = [&](double step) { return kPad + (kW - 2 * kPad) * step / n; };
  auto y = [&](double v) { return kH - kPad - (kH - 2 * kPad) * (v - lo) / (hi - lo); };
  std::ostringstream os;
  os.precision(6);
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH << "\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<text x=\"" << kW / 2 << "\" y=\"20\" text-anchor=\"middle\" font-family=\"sans-serif\" font-size=\"14\">"
     << title << "</text>\n"
     << "<line x1=\"" << kPad << "\" y1=\"" << kH - kPad << "\" x2=\"" << kW - kPad << "\" y2=\"" << kH - kPad
     << "\" stroke=\"black\"/>\n<line x1=\"" << kPad << "\" y1=\"" << kPad << "\" x2=\"" << kPad << "\" y2=\""
     << kH - kPad << "\" stroke=\"black\"/>\n"
     << "<text x=\"4\" y=\"" << kPad << "\" font-family=\"sans-serif\" font-size=\"11\">" << hi << "</text>\n"
     << "<text x=\"4\" y=\"" << kH - kPad << "\" font-family=\"sans-serif\" font-size=\"11\">" << lo << "</text>\n"
     << "<text x=\"" << kW - kPad << "\" y=\"" << kH - kPad + 16 << "\" text-anchor=\"end\" font-family=\"sans-serif\" "
     << "font-size=\"11\">step " << static_cast<int64_t>(n) << "</text>\n";
  auto polyline = [&](const std::vector<double>& ys, const char* colour) {
    os << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < ys.size(); ++i) os << x(steps[i]) << "," << y(ys[i]) << " ";
    os << "\"/>\n";
  };
  std::vector<double> avg;
  double window = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    window += values[i];
    if (i >= 10) window -= values[i - 10];
    avg.push_back(window / static_cast<double>(std::min<size_t>(i + 1, 10)));
  }
  polyline(values, "#9ecae1");
  polyline(avg, "#08519c");
  os << "</svg>\n";
  return os.str();
}

}  // namespace dc::train
