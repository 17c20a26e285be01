// The web page served at GET /: a prompt box, the settings, and the canvas drawn live from the `canvas`
// SSE events as the masks resolve, with timings.
#pragma once

#include <string_view>

namespace dc::server {

// The whole page (HTML, CSS and JavaScript in one document, no external resources).
std::string_view web_page();

}  // namespace dc::server
