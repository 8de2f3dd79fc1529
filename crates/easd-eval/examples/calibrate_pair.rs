//! Calibrates a real draft/target pair on the CPU and prints the result — a check of the harness on real models
//! until `easd calibrate` exists.
//!
//! `cargo run -p easd-eval --example calibrate_pair -- DRAFT.gguf TARGET.gguf DATA.jsonl QUESTIONS OUT.json [target-greedy] [greedy N]`
//! `target-greedy` calibrates on the target's own greedy answers instead of the reference solutions. With `greedy N`,
//! also prints the target's greedy answers to the first N problems of the file with the extracted value.

use std::path::PathBuf;
use std::time::Instant;

use easd_eval::{
    CalibrationConfig, CalibrationText, EntropyScorer, ModelScorer, PromptTemplate, extract_answer, load_problems,
    run_calibration,
};
use easd_model::LoadOptions;

fn main() -> Result<(), easd_eval::BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [draft, target, data, questions, out, rest @ ..] = args.as_slice() else {
        return Err("usage: DRAFT.gguf TARGET.gguf DATA.jsonl QUESTIONS OUT.json [target-greedy] [greedy N]".into());
    };
    let started = Instant::now();
    let draft = ModelScorer::load(&PathBuf::from(draft), &LoadOptions::default())?;
    let target = ModelScorer::load(&PathBuf::from(target), &LoadOptions::default())?;
    eprintln!("loaded in {:.1}s", started.elapsed().as_secs_f64());
    let mut config = CalibrationConfig::new(data);
    config.questions = questions.parse()?;
    let rest = match rest {
        [flag, rest @ ..] if flag == "target-greedy" => {
            config.text = CalibrationText::TargetGreedy;
            rest
        }
        _ => rest,
    };
    let started = Instant::now();
    let file = run_calibration(&config, &draft, &target, &mut |d, t| eprintln!("{d}/{t} questions"))?;
    eprintln!("calibrated in {:.1}s", started.elapsed().as_secs_f64());
    file.save(&PathBuf::from(out))?;
    println!("positions: {}  correlation: {:?}", file.draft.count, file.correlation);
    for (name, m) in [("draft", &file.draft), ("target", &file.target)] {
        println!("{name:6} {}: mean {:.3} {:?}", m.model, m.mean, m.percentiles);
    }
    for g in &file.gate_rates {
        println!(
            "p{}: tau_draft {:.3} tau_target {:.3} both uncertain {:.2}% fires {:.2}%",
            g.percentile,
            g.tau_draft,
            g.tau_target,
            100.0 * g.both_uncertain,
            100.0 * g.fires
        );
    }
    if let [flag, n] = rest
        && flag == "greedy"
    {
        let problems = load_problems(&PathBuf::from(data))?;
        for p in problems.iter().take(n.parse()?) {
            let messages = PromptTemplate::default().messages(&p.question);
            let started = Instant::now();
            let answer = target.greedy_answer(&messages, 512)?;
            let got = extract_answer(&answer);
            println!(
                "--- problem {} ({:.1}s) expected {:?} extracted {:?}\n{answer}",
                p.index,
                started.elapsed().as_secs_f64(),
                p.expected,
                got
            );
        }
    }
    Ok(())
}
