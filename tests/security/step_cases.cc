// Step streams with bad input: raw bytes that are not a StepRequest, messages out of order,
// headers and chunks that do not fit the session, commits that do not match, and streams over
// their bounds. Each targets the stepped session's next step, so none may apply it.

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "tests/security/bad_input_calls.h"
#include "tests/security/bad_input_cases.h"

namespace optstep {
namespace testutil {
namespace {

using Code = grpc::StatusCode;

constexpr uint64_t kNext = 3;  // the stepped session's next step

// A Step case of typed messages built from the stepped session's id.
BadInput Step(std::string name,
              std::function<std::vector<v1::StepRequest>(const std::string&)> make, Code code,
              std::string message) {
  return {std::move(name), [make](const Target& t) { return CallStep(t.channel, make(t.stepped)); },
          code, std::move(message)};
}

// A Step case of the stepped session's next header, then `raw` bytes as one message.
BadInput AfterHeader(std::string name, std::string raw, std::string message) {
  return {
      std::move(name),
      [raw](const Target& t) {
        return CallStepBytes(t.channel, {StepHeaderOf(t.stepped, kNext).SerializeAsString(), raw});
      },
      Code::INVALID_ARGUMENT, std::move(message)};
}

// A Step case of the next header with `edit` applied, then a full gradient and its commit.
BadInput Header(std::string name, std::function<void(v1::StepHeader&)> edit, Code code,
                std::string message) {
  return Step(
      std::move(name),
      [edit](const std::string& id) {
        v1::StepRequest header = StepHeaderOf(id, kNext);
        edit(*header.mutable_header());
        return std::vector<v1::StepRequest>{header, GradientOf(0, 0, std::vector<float>(32, 0.1f)),
                                            GradientOf(1, 0, std::vector<float>(8, 0.1f)),
                                            CommitOf(40)};
      },
      code, std::move(message));
}

// A Step case of the next header, then `chunks`, then a commit of `commit` elements.
BadInput Chunks(std::string name, std::vector<v1::StepRequest> chunks, Code code,
                std::string message, uint64_t commit = 0) {
  return Step(
      std::move(name),
      [chunks, commit](const std::string& id) {
        std::vector<v1::StepRequest> messages = {StepHeaderOf(id, kNext)};
        messages.insert(messages.end(), chunks.begin(), chunks.end());
        messages.push_back(CommitOf(commit));
        return messages;
      },
      code, std::move(message));
}

}  // namespace

std::vector<BadInput> StepCases() {
  const std::vector<float> full(32, 0.1f), bias(8, 0.1f);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  return {
      // Bytes that are no StepRequest.
      {"step: empty message", [](const Target& t) { return CallStepBytes(t.channel, {""}); },
       Code::INVALID_ARGUMENT, "empty StepRequest"},
      {"step: truncated tag", [](const Target& t) { return CallStepBytes(t.channel, {"\x80"}); },
       Code::INVALID_ARGUMENT, "truncated or invalid tag"},
      {"step: field number 0",
       [](const Target& t) { return CallStepBytes(t.channel, {std::string("\x02\x00", 2)}); },
       Code::INVALID_ARGUMENT, "truncated or invalid tag"},
      {"step: tag over 32 bits",
       [](const Target& t) { return CallStepBytes(t.channel, {"\xff\xff\xff\xff\xff\x01"}); },
       Code::INVALID_ARGUMENT, "truncated or invalid tag"},
      {"step: header of wire type varint",
       [](const Target& t) { return CallStepBytes(t.channel, {"\x08\x01"}); },
       Code::INVALID_ARGUMENT, "wire type 0, expected 2"},
      {"step: header longer than the message",
       [](const Target& t) { return CallStepBytes(t.channel, {"\x0a\x10\x0a\x01"}); },
       Code::INVALID_ARGUMENT, "malformed StepRequest"},
      {"step: header that does not parse",
       [](const Target& t) { return CallStepBytes(t.channel, {"\x0a\x02\x0a\xff"}); },
       Code::INVALID_ARGUMENT, "malformed StepRequest"},
      AfterHeader("step: gradient of wire type varint", "\x10\x01", "wire type 0, expected 2"),
      AfterHeader("step: commit of wire type varint", "\x18\x01", "wire type 0, expected 2"),
      AfterHeader("step: gradient truncated inside its data",
                  std::string("\x12\x06\x22\x10\x00\x00\x00\x00", 8), "malformed StepRequest"),
      AfterHeader("step: gradient param_id of wire type bytes", std::string("\x12\x02\x0a\x00", 4),
                  "wire type 2, expected 0"),
      // Messages out of order.
      Step(
          "step: gradient before the header",
          [bias](const std::string&) {
            return std::vector<v1::StepRequest>{GradientOf(1, 0, bias)};
          },
          Code::INVALID_ARGUMENT, "gradient chunk before the StepHeader"),
      Step(
          "step: commit before the header",
          [](const std::string&) { return std::vector<v1::StepRequest>{CommitOf(0)}; },
          Code::INVALID_ARGUMENT, "StepCommit before the StepHeader"),
      Step(
          "step: a second header",
          [](const std::string& id) {
            return std::vector<v1::StepRequest>{StepHeaderOf(id, kNext), StepHeaderOf(id, kNext)};
          },
          Code::INVALID_ARGUMENT, "a second StepHeader"),
      // Headers that do not fit the session.
      Header(
          "step: unknown session", [](v1::StepHeader& h) { h.set_session_id("s-nope"); },
          Code::NOT_FOUND, "session 's-nope' not found"),
      Header(
          "step: step 0", [](v1::StepHeader& h) { h.set_step(0); }, Code::INVALID_ARGUMENT,
          "step must be >= 1"),
      Header(
          "step: a future step", [](v1::StepHeader& h) { h.set_step(9); },
          Code::FAILED_PRECONDITION, "step 9 out of sequence; expected step 3"),
      Header(
          "step: an ancient step", [](v1::StepHeader& h) { h.set_step(1); },
          Code::FAILED_PRECONDITION, "step 1 out of sequence; expected step 3"),
      Header(
          "step: step 2^64-1", [](v1::StepHeader& h) { h.set_step(~uint64_t{0}); },
          Code::FAILED_PRECONDITION, "expected step 3"),
      Header(
          "step: trainer out of range", [](v1::StepHeader& h) { h.set_trainer_id(1); },
          Code::INVALID_ARGUMENT, "trainer_id 1 out of range"),
      Header(
          "step: trainer 2^32-1", [](v1::StepHeader& h) { h.set_trainer_id(~0u); },
          Code::INVALID_ARGUMENT, "out of range"),
      Header(
          "step: fp16 return dtype", [](v1::StepHeader& h) { h.set_return_dtype(v1::DTYPE_FP16); },
          Code::INVALID_ARGUMENT, "return_dtype 3 must be fp32 or bf16"),
      Header(
          "step: unknown return param", [](v1::StepHeader& h) { h.add_return_param_ids(9); },
          Code::NOT_FOUND, "return_param_ids: param_id 9 not found"),
      Header(
          "step: return param listed twice",
          [](v1::StepHeader& h) {
            for (uint32_t id : {0u, 1u, 0u}) h.add_return_param_ids(id);
          },
          Code::INVALID_ARGUMENT, "return_param_ids: param_id 0 ('fc.weight') is listed twice"),
      Header(
          "step: unknown group", [](v1::StepHeader& h) { h.add_groups()->set_group_id(5); },
          Code::INVALID_ARGUMENT, "unknown group 5"),
      Header(
          "step: lr override NaN", [=](v1::StepHeader& h) { h.add_groups()->set_lr(nan); },
          Code::INVALID_ARGUMENT, "lr = nan must be finite"),
      Header(
          "step: lr override 1e30", [](v1::StepHeader& h) { h.add_groups()->set_lr(1e30); },
          Code::INVALID_ARGUMENT, "lr = 1e+30"),
      Header(
          "step: weight_decay override negative",
          [](v1::StepHeader& h) { h.add_groups()->set_weight_decay(-2); }, Code::INVALID_ARGUMENT,
          "weight_decay = -2"),
      // Chunks that do not fit the parameters.
      Chunks("step: unknown param_id", {GradientOf(2, 0, bias)}, Code::NOT_FOUND,
             "param_id 2 not found"),
      Chunks("step: chunk past the end", {GradientOf(0, 30, {1, 2, 3, 4})}, Code::INVALID_ARGUMENT,
             "chunk [30, 34) exceeds 32 elements"),
      Chunks("step: chunk offset 2^63", {GradientOf(0, uint64_t{1} << 63, {1})},
             Code::INVALID_ARGUMENT, "offset 9223372036854775808 out of range"),
      Chunks("step: empty chunk", {GradientOf(1, 0, {})}, Code::INVALID_ARGUMENT,
             "empty chunk at offset 0"),
      [] {
        v1::StepRequest odd = GradientOf(1, 0, {1, 2});
        odd.mutable_gradient()->mutable_data()->resize(6);
        return Chunks("step: bytes not a multiple of fp32", {odd}, Code::INVALID_ARGUMENT,
                      "6 bytes is not a multiple");
      }(),
      Chunks("step: int64 gradient", {GradientOf(1, 0, bias, v1::DTYPE_INT64)},
             Code::INVALID_ARGUMENT, "dtype"),
      Chunks("step: unknown gradient dtype", {GradientOf(1, 0, bias, static_cast<v1::DType>(42))},
             Code::INVALID_ARGUMENT, "dtype"),
      Chunks("step: unspecified gradient dtype", {GradientOf(1, 0, bias, v1::DTYPE_UNSPECIFIED)},
             Code::INVALID_ARGUMENT, "dtype"),
      Chunks("step: overlapping chunks",
             {GradientOf(0, 0, {1, 2, 3, 4}), GradientOf(0, 2, {1, 2, 3})}, Code::INVALID_ARGUMENT,
             "chunk [2, 5) from trainer 0 overlaps chunk [0, 4)"),
      Chunks("step: duplicate chunk", {GradientOf(1, 0, bias), GradientOf(1, 0, bias)},
             Code::INVALID_ARGUMENT, "duplicates chunk [0, 8)"),
      // Commits that do not match what was sent.
      Chunks("step: commit without gradients", {}, Code::INVALID_ARGUMENT,
             "gradient elements [0, 32) of 32 missing"),
      Chunks("step: commit with a gap", {GradientOf(0, 0, full), GradientOf(1, 4, {1, 2, 3, 4})},
             Code::INVALID_ARGUMENT, "gradient elements [0, 4) of 8 missing"),
      Chunks("step: commit count differs", {GradientOf(0, 0, full), GradientOf(1, 0, bias)},
             Code::INVALID_ARGUMENT, "commits 99 elements but sent 40", 99),
      // A different contribution to the step already applied: no replay.
      Step(
          "step: another gradient for the applied step",
          [full, bias](const std::string& id) {
            return std::vector<v1::StepRequest>{StepHeaderOf(id, kNext - 1), GradientOf(0, 0, full),
                                                GradientOf(1, 0, bias), CommitOf(40)};
          },
          Code::FAILED_PRECONDITION, "step 2 of session '"),
      // Streams over their bounds.
      {"step: bytes over the stream bound",
       [](const Target& t) {
         // Field 999, unknown to every reader and skipped, but counted.
         const uint64_t pad = kMaxStreamBytes + 1024;
         return CallStepBytes(t.channel,
                              {StepHeaderOf(t.stepped, kNext).SerializeAsString(),
                               Varint((999 << 3) | 2) + Varint(pad) + std::string(pad, 'p')});
       },
       Code::RESOURCE_EXHAUSTED, absl::StrCat("over the bound of ", kMaxStreamBytes, " bytes")},
      {"step: a trainer that goes silent",
       [](const Target& t) {
         return CallStepBytes(t.channel, {StepHeaderOf(t.stepped, kNext).SerializeAsString()},
                              /*half_close=*/false);
       },
       Code::DEADLINE_EXCEEDED, absl::StrCat(kStreamIdleTimeoutMs)},
      {"step: half-close without a commit",
       [](const Target& t) {
         return CallStepBytes(t.channel, {StepHeaderOf(t.stepped, kNext).SerializeAsString()});
       },
       Code::CANCELLED, "stream closed before the commit"},
  };
}

}  // namespace testutil
}  // namespace optstep
