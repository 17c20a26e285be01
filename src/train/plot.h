// An SVG line plot of a per-step quantity (the training loss, the GRPO reward) for the run directories.
#pragma once

#include <string>
#include <vector>

namespace dc::train {

// `values` against `steps` (same length, steps increasing) and their 10-step moving average, titled
// `title`, with the value range and the last step labelled.
std::string line_plot_svg(const std::string& title, const std::vector<double>& steps, const std::vector<double>& values);

}  // namespace dc::train
