#include "client/cli/table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace optstep {
namespace cli {
namespace {

void AppendCell(const std::string& cell, size_t width, bool align_right, bool last,
                std::string* out) {
  const std::string pad(width - cell.size(), ' ');
  if (align_right) {
    absl::StrAppend(out, pad, cell);
  } else if (last) {
    absl::StrAppend(out, cell);  // no trailing spaces
  } else {
    absl::StrAppend(out, cell, pad);
  }
}

}  // namespace

TextTable::TextTable(std::vector<Column> columns) : columns_(std::move(columns)) {}

void TextTable::AddRow(std::vector<std::string> cells) {
  CHECK_EQ(cells.size(), columns_.size()) << "row width differs from the header";
  rows_.push_back(std::move(cells));
}

std::string TextTable::Render() const {
  std::vector<size_t> widths(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    widths[c] = columns_[c].header.size();
    for (const auto& row : rows_) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  auto append_line = [&](auto cell_at) {
    for (size_t c = 0; c < columns_.size(); ++c) {
      if (c > 0) out += "  ";
      AppendCell(cell_at(c), widths[c], columns_[c].align_right, c + 1 == columns_.size(),
                 &out);
    }
    out += '\n';
  };
  append_line([&](size_t c) -> const std::string& { return columns_[c].header; });
  for (const auto& row : rows_) {
    append_line([&](size_t c) -> const std::string& { return row[c]; });
  }
  return out;
}

}  // namespace cli
}  // namespace optstep
