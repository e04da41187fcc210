//! `trace-train compare A.json B.json ...`: models of several `eval
//! --environment` reports, per environment with intervals, then dominance
//! by the Pareto, Beta and threshold rules and each rule's frontier; the
//! comparison as JSON and as a picture on request.

use std::path::PathBuf;

use clap::Args;

use trace_train::eval::dominance::BETA_LEVEL;
use trace_train::eval::envs::EnvsReport;
use trace_train::eval::{plot, standings::Standings};

#[derive(Args, Clone, Debug)]
#[command(rename_all = "snake_case")]
pub struct CompareArgs {
    /// Reports of `eval --environment`, earliest model first (the
    /// incumbent, which the Beta and threshold rules favour on ties).
    #[arg(required = true, num_args = 2.., value_name = "REPORT.json")]
    pub reports: Vec<PathBuf>,
    /// Interval level of the table and of the Beta rule's duel.
    #[arg(long, default_value_t = BETA_LEVEL)]
    pub level: f64,
    /// Also write the comparison as JSON here.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Also draw it here: per-environment bars with intervals, and with
    /// two environments a scatter with the frontier (`.png` or `.svg`).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print the comparison as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &CompareArgs) -> anyhow::Result<()> {
    let reports = args
        .reports
        .iter()
        .map(|p| Ok((p.display().to_string(), EnvsReport::read(p)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Models scored on different tasks are not compared.
    let splits: std::collections::BTreeSet<&str> = reports
        .iter()
        .filter_map(|(_, r)| r.split.as_deref())
        .collect();
    anyhow::ensure!(
        splits.len() <= 1,
        "these reports evaluated different tasks (--split {})\nhint: rerun `eval --environment` with the same --split for every model",
        splits.into_iter().collect::<Vec<_>>().join(" and ")
    );
    let s = Standings::new(&reports, args.level)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", s.text());
    }
    if let Some(out) = &args.output {
        trace_train::atomic::write(out, serde_json::to_string_pretty(&s)?.as_bytes())?;
        eprintln!("comparison: {}", out.display());
    }
    if let Some(p) = &args.plot {
        plot::draw(&s, p)?;
        eprintln!("picture: {}", p.display());
    }
    Ok(())
}
