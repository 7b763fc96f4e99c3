#ifndef OPTSTEP_CLIENT_CLI_TABLE_H_
#define OPTSTEP_CLIENT_CLI_TABLE_H_

// A plain-text table for terminal output: a header row, then one line per row, every column
// padded to its widest cell and separated by two spaces; no trailing spaces. Thread-compatible.

#include <string>
#include <vector>

namespace optstep {
namespace cli {

class TextTable final {
 public:
  struct Column {
    std::string header;
    bool align_right = false;  // numbers
  };

  explicit TextTable(std::vector<Column> columns);

  // REQUIRES: cells.size() == number of columns.
  void AddRow(std::vector<std::string> cells);

  size_t num_rows() const { return rows_.size(); }

  // Lines end in '\n'.
  std::string Render() const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace cli
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CLI_TABLE_H_
