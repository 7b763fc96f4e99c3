// CreateSession with a spec that is malformed, out of bounds or over a limit.

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "tests/integration/test_session.h"
#include "tests/security/bad_input_calls.h"
#include "tests/security/bad_input_cases.h"

namespace optstep {
namespace testutil {
namespace {

using Code = grpc::StatusCode;

// A CreateSession case: SmallSpec("bad") changed by `edit`.
BadInput Create(std::string name, std::function<void(v1::SessionSpec&)> edit, Code code,
                std::string message) {
  return {std::move(name),
          [edit](const Target& t) {
            v1::SessionSpec spec = SmallSpec("bad");
            edit(spec);
            return CallCreate(t.channel, spec);
          },
          code, std::move(message)};
}

BadInput Shape(std::string name, std::vector<uint64_t> shape, std::string message) {
  return Create(
      std::move(name),
      [shape](v1::SessionSpec& s) {
        s.mutable_parameters(0)->clear_shape();
        for (uint64_t d : shape) s.mutable_parameters(0)->add_shape(d);
      },
      Code::INVALID_ARGUMENT, std::move(message));
}

const char kCreate[] = "/optstep.v1.OptimizerService/CreateSession";

// A CreateSession of SmallSpec("") with `request_id`.
BadInput RequestId(std::string name, std::string request_id, std::string message) {
  return {std::move(name),
          [request_id](const Target& t) {
            v1::CreateSessionRequest request;
            *request.mutable_spec() = SmallSpec("");
            request.set_request_id(request_id);
            return CallUnary(t.channel, kCreate, request);
          },
          Code::INVALID_ARGUMENT, std::move(message)};
}

}  // namespace

std::vector<BadInput> SessionSpecCases() {
  return {
      {"create: unparsable bytes",
       [](const Target& t) { return CallUnaryBytes(t.channel, kCreate, "\xff\xff\xff\xff"); },
       Code::INVALID_ARGUMENT, "does not parse"},
      {"create: truncated length-delimited field",
       [](const Target& t) { return CallUnaryBytes(t.channel, kCreate, "\x0a\x40\x0a"); },
       Code::INVALID_ARGUMENT, "does not parse"},
      Create(
          "create: no parameters", [](v1::SessionSpec& s) { s.clear_parameters(); },
          Code::INVALID_ARGUMENT, "declares no parameters"),
      Create(
          "create: empty parameter name",
          [](v1::SessionSpec& s) { s.mutable_parameters(1)->clear_name(); }, Code::INVALID_ARGUMENT,
          "parameter 1: name is empty"),
      Create(
          "create: duplicate parameter name",
          [](v1::SessionSpec& s) { s.mutable_parameters(1)->set_name("fc.weight"); },
          Code::INVALID_ARGUMENT, "param 'fc.weight': declared twice"),
      Create(
          "create: session name with a control character",
          [](v1::SessionSpec& s) { s.set_name("bad\x1b[2J"); }, Code::INVALID_ARGUMENT,
          "session name 'bad\\x1b[2J' contains the control character '\\x1b' at byte 3"),
      RequestId("create: request_id with a control character", "retry\n1",
                "request_id 'retry\\n1' contains the control character '\\n' at byte 5"),
      RequestId("create: request_id of 129 bytes", std::string(129, 'r'),
                "has 129 bytes (at most 128)"),
      Create(
          "create: session name of 256 bytes",
          [](v1::SessionSpec& s) { s.set_name(std::string(256, 'n')); }, Code::INVALID_ARGUMENT,
          "has 256 bytes (at most 255)"),
      Create(
          "create: parameter name with a newline",
          [](v1::SessionSpec& s) { s.mutable_parameters(0)->set_name("fc.weight\nforged"); },
          Code::INVALID_ARGUMENT, "parameter 0: name 'fc.weight\\nforged' contains the control"),
      Create(
          "create: parameter name of 64 KiB",
          [](v1::SessionSpec& s) { s.mutable_parameters(0)->set_name(std::string(64 << 10, 'p')); },
          Code::INVALID_ARGUMENT, "...(65536 bytes)' has 65536 bytes (at most 1024)"),
      Shape("create: zero dimension", {8, 0}, "dimension 0 is not in [1, 2^40]"),
      Shape("create: dimension over 2^40", {uint64_t{1} << 41},
            "dimension 2199023255552 is not in [1, 2^40]"),
      Shape("create: negative dimension as uint64", {static_cast<uint64_t>(-8)},
            "dimension 18446744073709551608 is not in"),
      Shape("create: 65 dimensions", std::vector<uint64_t>(65, 1),
            "param 'fc.weight': 65 dimensions (at most 64)"),
      Shape("create: shape product overflows int64",
            {uint64_t{1} << 30, uint64_t{1} << 30, uint64_t{1} << 30},
            "dimension 1073741824 is not in [1, 2^40]"),
      Create(
          "create: over the session byte limit",
          [](v1::SessionSpec& s) { s.mutable_parameters(0)->set_shape(0, 1u << 20); },
          Code::RESOURCE_EXHAUSTED,
          absl::StrCat("the limit is ", kMaxSessionBytes, " bytes per session")),
      Create(
          "create: qkv split does not match the shape",
          [](v1::SessionSpec& s) {
            v1::QkvSplit* q = s.mutable_parameters(0)->mutable_qkv();
            q->set_num_query_groups(1);
            q->set_q_per_group(1);
            q->set_head_dim(3);
          },
          Code::INVALID_ARGUMENT, "qkv split (1 groups x (1 + 2) heads x 3) does not match"),
      Create(
          "create: qkv split of zero heads",
          [](v1::SessionSpec& s) { s.mutable_parameters(0)->mutable_qkv(); },
          Code::INVALID_ARGUMENT, "qkv split (0 groups"),
      Create(
          "create: zero trainers", [](v1::SessionSpec& s) { s.set_num_trainers(0); },
          Code::INVALID_ARGUMENT, "num_trainers = 0 must be in [1, 4096]"),
      Create(
          "create: too many trainers", [](v1::SessionSpec& s) { s.set_num_trainers(4097); },
          Code::INVALID_ARGUMENT, "num_trainers = 4097 must be in [1, 4096]"),
      Create(
          "create: unspecified gradient mode",
          [](v1::SessionSpec& s) { s.set_gradient_mode(v1::GRADIENT_MODE_UNSPECIFIED); },
          Code::INVALID_ARGUMENT, "gradient_mode 0 must be SHARDED or REPLICATED"),
      Create(
          "create: unknown gradient mode",
          [](v1::SessionSpec& s) { s.set_gradient_mode(static_cast<v1::GradientMode>(77)); },
          Code::INVALID_ARGUMENT, "gradient_mode 77 must be SHARDED or REPLICATED"),
      Create(
          "create: too many parameters",
          [](v1::SessionSpec& s) {
            for (int i = 0; i < kMaxParamsPerSession; ++i) {
              v1::ParameterSpec* p = s.add_parameters();
              p->set_name(absl::StrCat("extra.", i));
              p->add_shape(1);
            }
          },
          Code::RESOURCE_EXHAUSTED,
          absl::StrCat("session declares ", kMaxParamsPerSession + 2, " parameters; the limit is ",
                       kMaxParamsPerSession)),
      Create(
          "create: too many routing rules",
          [](v1::SessionSpec& s) {
            for (int i = 0; i < 257; ++i) {
              v1::RoutingRule* rule = s.mutable_optimizer()->add_rules();
              rule->set_name_glob("z");
              rule->set_sub_optimizer("adam");
            }
          },
          Code::INVALID_ARGUMENT, "optimizer: 257 routing rules (at most 256)"),
      Create(
          "create: routing glob of 64 KiB",
          [](v1::SessionSpec& s) {
            v1::RoutingRule* rule = s.mutable_optimizer()->add_rules();
            rule->set_name_glob(std::string(64 << 10, '*'));
            rule->set_sub_optimizer("adam");
          },
          Code::INVALID_ARGUMENT, "optimizer: rule 0: name_glob '"),
      Create(
          "create: routing globs too long for the parameters' names",
          [](v1::SessionSpec& s) {
            for (int i = 0; i < 256; ++i) {
              v1::RoutingRule* rule = s.mutable_optimizer()->add_rules();
              rule->set_name_glob("*" + std::string(1022, 'a') + "b");
              rule->set_sub_optimizer("adam");
            }
            for (int i = 0; i < 3000; ++i) {
              v1::ParameterSpec* p = s.add_parameters();
              p->set_name(absl::StrCat(std::string(1000, 'a'), i));
              p->add_shape(1);
            }
          },
          Code::INVALID_ARGUMENT, "matching steps, over the bound of 1073741824"),
      Create(
          "create: existing name with another definition",
          [](v1::SessionSpec& s) {
            s.set_name("stepped");
            s.mutable_parameters(1)->set_shape(0, 9);
          },
          Code::FAILED_PRECONDITION, "exists with a different definition"),
      Create(
          "create: unknown preset",
          [](v1::SessionSpec& s) { s.mutable_optimizer()->set_preset("adagrad"); },
          Code::INVALID_ARGUMENT, "adagrad"),
      Create(
          "create: no optimizer", [](v1::SessionSpec& s) { s.clear_optimizer(); },
          Code::INVALID_ARGUMENT, "give a preset or at least one sub_optimizer"),
      Create(
          "create: megatron_args without a preset",
          [](v1::SessionSpec& s) {
            s.mutable_optimizer()->clear_preset();
            (*s.mutable_optimizer()->mutable_megatron_args())["lr"] = "0.1";
            s.mutable_optimizer()->add_sub_optimizers()->set_kind("sgd");
          },
          Code::INVALID_ARGUMENT, "megatron_args need a preset"),
      Create(
          "create: unparsable megatron arg",
          [](v1::SessionSpec& s) { (*s.mutable_optimizer()->mutable_megatron_args())["lr"] = "x"; },
          Code::INVALID_ARGUMENT, "lr"),
      Create(
          "create: unknown megatron arg",
          [](v1::SessionSpec& s) {
            (*s.mutable_optimizer()->mutable_megatron_args())["no_such_arg"] = "1";
          },
          Code::INVALID_ARGUMENT, "no_such_arg"),
      Create(
          "create: preset and sub_optimizers",
          [](v1::SessionSpec& s) { s.mutable_optimizer()->add_sub_optimizers()->set_kind("sgd"); },
          Code::INVALID_ARGUMENT, "mutually exclusive"),
      Create(
          "create: clip_grad NaN",
          [](v1::SessionSpec& s) {
            s.mutable_optimizer()->set_clip_grad(std::numeric_limits<double>::quiet_NaN());
          },
          Code::INVALID_ARGUMENT, "clip_grad = nan must be finite"),
      Create(
          "create: mup_width_mult zero",
          [](v1::SessionSpec& s) { s.mutable_optimizer()->set_mup_width_mult(0); },
          Code::INVALID_ARGUMENT, "mup_width_mult = 0"),
      Create(
          "create: mup_width_mult infinite",
          [](v1::SessionSpec& s) {
            s.mutable_optimizer()->set_mup_width_mult(std::numeric_limits<double>::infinity());
          },
          Code::INVALID_ARGUMENT, "mup_width_mult = inf"),
  };
}

}  // namespace testutil
}  // namespace optstep
