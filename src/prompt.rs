//! The Trace environment's prompt, word for word, and its original-program
//! counterpart for Stage 1 (the same request without the debug-print note).

/// The environment's prompt for a transformed program.
pub fn trace_prompt(program: &str, inputs: &str) -> String {
    format!(
        "Predict the exact and complete standard output (stdout) of the following Python program, including every single print statement.\n\n\
The program contains several injected debug print statements starting with '__DBG_'. You must include these in your prediction exactly as they would appear in the output, along with any other output the program produces.\n\n\
Program:\n```python\n{program}\n```\n\n\
Input (stdin):\n```\n{inputs}\n```\n\n\
Provide the full stdout content. Do not provide any explanations or commentary outside of the predicted output."
    )
}

/// Stage 1's prompt: the same task on the unmodified program.
pub fn original_prompt(program: &str, inputs: &str) -> String {
    format!(
        "Predict the exact and complete standard output (stdout) of the following Python program, including every single print statement.\n\n\
Program:\n```python\n{program}\n```\n\n\
Input (stdin):\n```\n{inputs}\n```\n\n\
Provide the full stdout content. Do not provide any explanations or commentary outside of the predicted output."
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn prompt_layout() {
        let p = super::trace_prompt("print(1)", "5\n");
        assert!(p.starts_with("Predict the exact and complete standard output (stdout)"));
        assert!(p.contains("starting with '__DBG_'"));
        assert!(p.contains("Program:\n```python\nprint(1)\n```\n\nInput (stdin):\n```\n5\n\n```\n\nProvide the full stdout content."));
        assert!(!super::original_prompt("x", "").contains("__DBG_"));
    }
}
