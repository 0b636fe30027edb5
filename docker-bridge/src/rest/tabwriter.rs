//! Column alignment as Go's `text/tabwriter` does it, for nvidia-docker's text pages
//! (`tabwriter.NewWriter(w, 0, 4, 0, ' ', 0)`: no minimum width, no padding, spaces).
//!
//! Go's rules: a cell is text terminated by a tab; the text after a line's last tab is not a
//! cell and is never padded. A column block is a run of consecutive lines that all have a cell
//! in that column; every cell of a block is padded to the block's widest cell (width counted in
//! characters). Blocks of the next column are found inside each block, recursively.

/// Aligns `text` (lines separated by `\n`, cells by `\t`) the way Go's tabwriter would.
pub(crate) fn align(text: &str) -> String {
    let lines: Vec<Vec<&str>> = text.split('\n').map(|l| l.split('\t').collect()).collect();
    let mut out = String::with_capacity(text.len() + 64);
    let mut widths = Vec::new();
    format(&lines, 0, lines.len(), &mut widths, &mut out);
    // `split` yields one line more than there are newlines; every line but the last ends in one.
    if out.ends_with('\n') {
        out.pop();
    }
    out
}

fn format(
    lines: &[Vec<&str>],
    mut line0: usize,
    line1: usize,
    widths: &mut Vec<usize>,
    out: &mut String,
) {
    let column = widths.len();
    let mut this = line0;
    while this < line1 {
        if column + 1 >= lines[this].len() {
            this += 1;
            continue;
        }
        // A cell in this column starts a block: print the lines before it, then size the block.
        write_lines(lines, line0, this, widths, out);
        line0 = this;
        let mut width = 0;
        while this < line1 && column + 1 < lines[this].len() {
            width = width.max(lines[this][column].chars().count());
            this += 1;
        }
        widths.push(width);
        format(lines, line0, this, widths, out);
        widths.pop();
        line0 = this;
    }
    write_lines(lines, line0, line1, widths, out);
}

fn write_lines(lines: &[Vec<&str>], from: usize, to: usize, widths: &[usize], out: &mut String) {
    for line in &lines[from..to] {
        for (j, cell) in line.iter().enumerate() {
            out.push_str(cell);
            if j + 1 < line.len() && j < widths.len() {
                let pad = widths[j].saturating_sub(cell.chars().count());
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_runs_of_lines_and_breaks_on_shorter_lines() {
        let text = "\n\tDriver version:  \t550.54\n\tSupported CUDA version:  \t12.4\n\t\n\tDevice #0\n\t  Model:  \tV100\n\t  CPU Affinity:  \tNUMA node0\n\t  PCI\n\t    Bus ID:  \t0000:06:00.0\n\t";
        let want = "\nDriver version:          550.54\nSupported CUDA version:  12.4\n\nDevice #0\n  Model:         V100\n  CPU Affinity:  NUMA node0\n  PCI\n    Bus ID:  0000:06:00.0\n";
        assert_eq!(align(text), want);
    }

    #[test]
    fn counts_characters_not_bytes() {
        assert_eq!(align("a\tx\n°C°\ty"), "a  x\n°C°y");
    }

    #[test]
    fn text_without_tabs_is_unchanged() {
        for t in ["", "abc", "a\nb\n", "\n\n"] {
            assert_eq!(align(t), t);
        }
    }
}
