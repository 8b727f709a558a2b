//! The `userdma` command-line tool.
fn main() {}
