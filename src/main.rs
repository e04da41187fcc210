use std::path::PathBuf;

use anyhow::Context;
use trace_train::sandbox::{Executor, ExecutorConfig, Request, check_protections};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let cfg = ExecutorConfig::new(PathBuf::from("/usr/bin/python3"), 1, false);
    let exec = Executor::new(cfg)?;
    if args.get(1).map(|s| s.as_str()) == Some("check") {
        let r = check_protections(&exec);
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    if args.get(1).map(|s| s.as_str()) == Some("many") {
        let n: usize = args[3].parse()?;
        let cfg = ExecutorConfig::new(PathBuf::from("/usr/bin/python3"), 2, args.get(4).is_some());
        let exec = Executor::new(cfg)?;
        let prog = std::fs::read(&args[2])?;
        let reqs: Vec<_> = (0..n).map(|_| Request::new(prog.clone(), "4\n")).collect();
        let t = std::time::Instant::now();
        let outs = exec.run_all(&reqs);
        let el = t.elapsed().as_secs_f64();
        let ok = outs.iter().filter(|o| o.status == trace_train::sandbox::Status::Ok).count();
        let wall: f64 = outs.iter().map(|o| o.wall_ms).sum::<f64>() / n as f64;
        println!("{n} runs {ok} ok in {el:.3}s = {:.1}/s, mean zygote wall {wall:.2}ms", n as f64 / el);
        return Ok(());
    }
    let prog = std::fs::read(&args[1]).context("read")?;
    let stdin = args.get(2).map(std::fs::read).transpose()?.unwrap_or_default();
    let out = exec.run(&Request::new(prog, stdin));
    println!("{}", serde_json::to_string_pretty(&out.to_json())?);
    Ok(())
}
#[allow(dead_code)]
fn bench_quick() {}
