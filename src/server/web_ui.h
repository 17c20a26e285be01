// The web page served at GET /: a prompt box, the settings, and the canvas drawn live from the `canvas`
// SSE events as the masks resolve, with timings.
#pragma once

#include <string>

namespace dc::server {

// The whole page (HTML, CSS and JavaScript in one document, no external resources). `needs_key`: the
// server has API keys, so the page shows a key field and sends the key as `Authorization: Bearer`.
std::string web_page(bool needs_key);

}  // namespace dc::server
