// dspark_step's line about SpecTpSync sites: the sites that actually synced in this run (enabled by
// RELAYOUT_SPEC_TP_SYNC and visited by the decoder, over a sync group of more than one rank), and
// the enabled sites the run never reached, so "ACCEPT_SAMPLE" under greedy acceptance is not
// reported as "off".
#pragma once

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "relayout/spec/sync_sites.hpp"

namespace relayout::cli {

struct SyncedSites {
  std::vector<std::string> enabled;  // by RELAYOUT_SPEC_TP_SYNC, in the built-in order
  std::vector<std::string> synced;   // enabled and visited, over more than one rank
  std::string text;
};

inline SyncedSites synced_sites(const spec::SyncSites& sites, const std::set<std::string>& visited, int sync_size) {
  SyncedSites r;
  std::vector<std::string> unvisited;
  for (const std::string& s : sites.names()) {
    if (!sites.enabled(s)) continue;
    r.enabled.push_back(s);
    if (!visited.count(s)) unvisited.push_back(s);
    else if (sync_size > 1) r.synced.push_back(s);
  }
  const auto join = [](const std::vector<std::string>& v) {
    std::string t;
    for (const std::string& s : v) t += (t.empty() ? "" : " ") + s;
    return "[" + t + "]";
  };
  const char* env = std::getenv("RELAYOUT_SPEC_TP_SYNC");
  const std::string setting = "RELAYOUT_SPEC_TP_SYNC=" + std::string(env ? env : "all (default)");
  r.text = "sites synced " + (r.synced.empty() ? std::string("none") : join(r.synced)) + " (" + setting;
  if (r.enabled.empty()) r.text += ": every site off";
  if (!unvisited.empty()) r.text += "; enabled but not reached by this run: " + join(unvisited);
  if (sync_size == 1 && !r.enabled.empty()) r.text += "; a 1-rank sync group has nothing to sync";
  r.text += ")";
  return r;
}

}  // namespace relayout::cli
