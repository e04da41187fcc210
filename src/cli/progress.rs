//! The bar every subcommand draws on stderr for [`Progress`]; hidden when
//! stderr is not a terminal (logs, tests, pipes).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use trace_train::progress::Progress;

pub struct Bar(ProgressBar);

impl Bar {
    /// A bar counting `unit`s (`rows`, `step`).
    pub fn new(unit: &str) -> Self {
        let pb = if std::io::stderr().is_terminal() {
            ProgressBar::new(0)
        } else {
            ProgressBar::hidden()
        };
        pb.set_style(
            ProgressStyle::with_template(&format!(
                "{{spinner}} {unit} {{pos}}/{{len}} [{{elapsed_precise}}] {{bar:30}} ETA {{eta}} {{msg}}"
            ))
            .expect("valid template"),
        );
        Bar(pb)
    }
}

impl Progress for Bar {
    fn start(&self, total: Option<u64>, done: u64) {
        if let Some(t) = total {
            self.0.set_length(t);
        }
        self.0.set_position(done);
    }
    fn set(&self, done: u64) {
        self.0.set_position(done);
    }
    fn advance(&self, n: u64) {
        self.0.inc(n);
    }
    fn status(&self, text: &str) {
        self.0.set_message(text.to_owned());
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
}
