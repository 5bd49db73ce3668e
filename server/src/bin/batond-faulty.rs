//! `batond-faulty`: batond built with the `fault-injection` feature, for
//! the Jepsen harness only (see `faults.rs`). Same code as `batond`.

#[path = "../main.rs"]
mod batond;

fn main() {
    batond::main()
}
