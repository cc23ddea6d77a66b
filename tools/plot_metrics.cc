// plot_metrics METRICS.jsonl OUT.svg: reward and loss curves of a training run, as an SVG a
// person can open in a browser. One panel per metric (reward_mean, loss), x = iteration, with the
// raw values and a moving average over 10 iterations.
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "launch/json.h"

namespace {

struct Series {
  std::string name;
  std::vector<double> x, y;
};

std::string Polyline(const std::vector<double>& x, const std::vector<double>& y, double x0,
                     double y0, double w, double h, double xmin, double xmax, double ymin,
                     double ymax, const char* color, double width) {
  std::ostringstream out;
  out << "<polyline fill='none' stroke='" << color << "' stroke-width='" << width << "' points='";
  for (size_t i = 0; i < x.size(); ++i) {
    const double px = x0 + (xmax > xmin ? (x[i] - xmin) / (xmax - xmin) : 0.5) * w;
    const double py = y0 + h - (ymax > ymin ? (y[i] - ymin) / (ymax - ymin) : 0.5) * h;
    out << px << "," << py << " ";
  }
  out << "'/>\n";
  return out.str();
}

std::string Panel(const Series& s, double top) {
  const double x0 = 70, w = 620, h = 220;
  double xmin = s.x.empty() ? 0 : s.x.front(), xmax = s.x.empty() ? 1 : s.x.back();
  double ymin = 1e300, ymax = -1e300;
  for (double v : s.y) {
    ymin = std::min(ymin, v);
    ymax = std::max(ymax, v);
  }
  if (s.y.empty()) ymin = 0, ymax = 1;
  if (ymax - ymin < 1e-12) ymin -= 0.5, ymax += 0.5;
  std::vector<double> smooth;
  for (size_t i = 0; i < s.y.size(); ++i) {
    double sum = 0;
    int n = 0;
    for (size_t j = i >= 9 ? i - 9 : 0; j <= i; ++j, ++n) sum += s.y[j];
    smooth.push_back(sum / n);
  }
  std::ostringstream out;
  out << "<text x='" << x0 << "' y='" << top - 8 << "' font-size='14'>" << s.name << "</text>\n";
  out << "<rect x='" << x0 << "' y='" << top << "' width='" << w << "' height='" << h
      << "' fill='none' stroke='#999'/>\n";
  char label[64];
  std::snprintf(label, sizeof(label), "%.3g", ymax);
  out << "<text x='4' y='" << top + 12 << "' font-size='11'>" << label << "</text>\n";
  std::snprintf(label, sizeof(label), "%.3g", ymin);
  out << "<text x='4' y='" << top + h << "' font-size='11'>" << label << "</text>\n";
  std::snprintf(label, sizeof(label), "iteration %.0f", xmax);
  out << "<text x='" << x0 + w - 90 << "' y='" << top + h + 14 << "' font-size='11'>" << label
      << "</text>\n";
  out << Polyline(s.x, s.y, x0, top, w, h, xmin, xmax, ymin, ymax, "#9ecae1", 1);
  out << Polyline(s.x, smooth, x0, top, w, h, xmin, xmax, ymin, ymax, "#08519c", 2);
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: plot_metrics METRICS.jsonl OUT.svg\n");
    return 2;
  }
  try {
    std::ifstream in(argv[1]);
    if (!in) throw std::runtime_error(std::string(argv[1]) + ": cannot open");
    Series reward{"reward_mean (light: per iteration, dark: mean of the last 10)", {}, {}};
    Series loss{"loss", {}, {}};
    std::string line;
    int line_number = 0;
    while (std::getline(in, line)) {
      ++line_number;
      if (line.empty()) continue;
      rl::json::Value v;
      try {
        v = rl::json::Parse(line);
      } catch (const std::exception& e) {
        throw std::runtime_error(std::string(argv[1]) + ":" + std::to_string(line_number) + ": " +
                                 e.what());
      }
      const double it = v.at("iteration").AsDouble();
      reward.x.push_back(it);
      reward.y.push_back(v.at("reward_mean").AsDouble());
      loss.x.push_back(it);
      loss.y.push_back(v.at("loss").AsDouble());
    }
    std::ofstream out(argv[2]);
    out << "<svg xmlns='http://www.w3.org/2000/svg' width='720' height='560' "
           "font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n"
        << Panel(reward, 30) << Panel(loss, 300) << "</svg>\n";
    if (!out) throw std::runtime_error(std::string(argv[2]) + ": cannot write");
    std::printf("wrote %s (%zu iterations)\n", argv[2], reward.x.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plot_metrics: %s\n", e.what());
    return 1;
  }
}
