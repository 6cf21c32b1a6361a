//! Every human-readable table the CLI prints goes through this one writer (comfy-table): each
//! column as wide as its widest cell and no wider, two spaces between columns, numbers aligned
//! right, no borders and no colour (the same on a terminal, in a pipe and pasted into an incident
//! channel).

use comfy_table::{CellAlignment, ColumnConstraint, ContentArrangement, Table as Inner};

pub struct Table {
    inner: Inner,
    right: Vec<usize>,
    columns: usize,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        let mut inner = Inner::new();
        inner
            .load_preset(comfy_table::presets::NOTHING)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(headers.to_vec());
        Table { inner, right: Vec::new(), columns: headers.len() }
    }

    /// Columns (by index) whose cells are aligned right: numbers.
    pub fn right(mut self, columns: &[usize]) -> Self {
        self.right.extend_from_slice(columns);
        self
    }

    pub fn row<S: ToString>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.inner.add_row(cells.into_iter().map(|c| c.to_string()).collect::<Vec<_>>());
    }

    /// The table as text, lines without trailing spaces.
    pub fn render(mut self) -> String {
        for index in 0..self.columns {
            let Some(column) = self.inner.column_mut(index) else { continue };
            // No space before the first column; two after every column but the last.
            column.set_padding((0, if index + 1 < self.columns { 2 } else { 0 }));
            column.set_constraint(ColumnConstraint::ContentWidth);
            if self.right.contains(&index) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        self.inner.to_string().lines().map(str::trim_end).collect::<Vec<_>>().join("\n")
    }

    pub fn print(self) {
        println!("{}", self.render());
    }
}

/// A JSON value as a cell: a string without its quotes, anything else as JSON, null as empty.
pub fn text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn columns_line_up_whatever_the_cells_and_no_wider_than_needed() {
        let mut table = Table::new(&["NUMBER", "STATUS", "NAME"]).right(&[0]);
        table.row(["0", "active", "us-east-1"]);
        table.row(["12", "retired", "eu-west-1"]);
        assert_eq!(table.render(), "NUMBER  STATUS   NAME\n     0  active   us-east-1\n    12  retired  eu-west-1",);
    }
}
