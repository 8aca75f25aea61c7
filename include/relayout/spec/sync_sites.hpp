// SpecTpSync sites (docs/dspark.md) and which of them sync, read from RELAYOUT_SPEC_TP_SYNC:
// "all" (default), "off", or a comma-separated list of site names.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "relayout/mesh/error.hpp"

namespace relayout::spec {

// The built-in site names, for code that names one site.
inline constexpr const char* kSiteDraftGreedy = "DRAFT_GREEDY";
inline constexpr const char* kSiteDraftSample = "DRAFT_SAMPLE";
inline constexpr const char* kSitePlan = "PLAN";
inline constexpr const char* kSiteAcceptGreedy = "ACCEPT_GREEDY";
inline constexpr const char* kSiteAcceptSample = "ACCEPT_SAMPLE";
inline constexpr const char* kSiteTarget = "TARGET";

class SyncSites {
 public:
  // The built-in sites, in this order; engines may register more with add_site().
  static constexpr std::string_view kBuiltin[] = {"DRAFT_GREEDY", "DRAFT_SAMPLE", "PLAN",
                                                  "ACCEPT_GREEDY", "ACCEPT_SAMPLE", "TARGET"};

  SyncSites() : names_(std::begin(kBuiltin), std::end(kBuiltin)), enabled_(names_.size(), true) {}

  // Registers an engine-specific site (enabled under "all"); returns its index.
  std::size_t add_site(std::string name) {
    names_.push_back(std::move(name));
    enabled_.push_back(all_);
    return names_.size() - 1;
  }

  // Applies a specification: "all", "off" or "SITE,SITE". Unknown names are an error.
  void configure(std::string_view spec) {
    if (spec.empty() || spec == "all") {
      set_all(true);
      return;
    }
    if (spec == "off") {
      set_all(false);
      return;
    }
    std::vector<bool> chosen(names_.size(), false);
    std::size_t start = 0;
    while (start <= spec.size()) {
      const std::size_t comma = spec.find(',', start);
      const std::string_view name =
          spec.substr(start, comma == std::string_view::npos ? spec.size() - start : comma - start);
      chosen.at(index_of(name)) = true;
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    all_ = false;
    enabled_ = chosen;
  }

  static SyncSites from_env(const char* variable = "RELAYOUT_SPEC_TP_SYNC") {
    SyncSites s;
    if (const char* v = std::getenv(variable)) s.configure(v);
    return s;
  }

  bool enabled(std::string_view site) const { return enabled_.at(index_of(site)); }
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::size_t index_of(std::string_view name) const {
    for (std::size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == name) return i;
    std::string known;
    for (const auto& n : names_) known += (known.empty() ? "" : ", ") + n;
    throw LayoutError("RELAYOUT_SPEC_TP_SYNC", "RELAYOUT_SPEC_TP_SYNC: unknown site '" +
                                                   std::string(name) + "'; use all, off or a "
                                                   "comma-separated list of: " + known);
  }
  void set_all(bool on) {
    all_ = on;
    enabled_.assign(names_.size(), on);
  }

  std::vector<std::string> names_;
  std::vector<bool> enabled_;
  bool all_ = true;
};

}  // namespace relayout::spec
