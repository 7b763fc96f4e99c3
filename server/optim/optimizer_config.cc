#include "server/optim/optimizer_config.h"

#include "absl/strings/str_cat.h"

namespace optstep {

std::string GroupOverrides::Key() const {
  std::string key;
  auto add = [&key](const char* name, const std::optional<double>& value) {
    if (value) absl::StrAppend(&key, name, "=", *value, ";");
  };
  add("lr", lr);
  add("weight_decay", weight_decay);
  add("wd_mult", wd_mult);
  add("beta1", beta1);
  add("beta2", beta2);
  add("eps", eps);
  add("momentum", momentum);
  add("lr_mult", lr_mult);
  add("eps_mult", eps_mult);
  return key;
}

}  // namespace optstep
