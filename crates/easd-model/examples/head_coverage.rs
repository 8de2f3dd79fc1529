//! Chooses and checks a pruned draft head (`--draft-head-vocab N`, `--draft-head-ranking FILE`) on real output:
//!
//! * `head_coverage rank <model.gguf> <ranking.txt> <file.jsonl>…` re-tokenizes the `output` texts of eval results
//!   files (and the `question` and `answer` texts of GSM8K data files) and writes their token ids, most frequent
//!   first (the ranking a head of N keeps the first N of);
//! * `head_coverage check <model.gguf> <results.jsonl> [N,N,… [ranking.txt]]` prints, for each N, the share of the
//!   outputs' tokens such a head scores (so a ranking made from some problems can be checked on others), and the
//!   tokens the largest head misses most often.
//!
//! `cargo run --release -p easd-model --example head_coverage -- check <model.gguf> <results.jsonl>`

use easd_model::{HeadVocab, Tokenizer};
use std::collections::HashMap;
use std::io::BufRead;

type Failure = Box<dyn std::error::Error>;

/// The token ids of every `output` text in eval results files (and `question`, `answer` in GSM8K data files).
fn output_ids(tokenizer: &Tokenizer, files: &[String]) -> Result<Vec<u32>, Failure> {
    let mut ids = Vec::new();
    for file in files {
        for line in std::io::BufReader::new(std::fs::File::open(file)?).lines() {
            let record: serde_json::Value = serde_json::from_str(&line?)?;
            for text in ["output", "question", "answer"].iter().filter_map(|key| record[*key].as_str()) {
                ids.extend(tokenizer.encode(text)?);
            }
        }
    }
    Ok(ids)
}

/// Ids by count, most frequent first (ties by id).
fn by_count(ids: impl Iterator<Item = u32>) -> Vec<(u32, usize)> {
    let mut counts = HashMap::<u32, usize>::new();
    for id in ids {
        *counts.entry(id).or_default() += 1;
    }
    let mut counts: Vec<(u32, usize)> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    counts
}

fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [cmd, model, out, results @ ..] if cmd == "rank" && !results.is_empty() => {
            let tokenizer = Tokenizer::from_gguf_file(model.as_ref())?;
            let ids = output_ids(&tokenizer, results)?;
            let ranked = by_count(ids.iter().copied());
            let mut text = format!(
                "# token ids by count in {} tokens of {}, most frequent first (head_coverage rank)\n",
                ids.len(),
                results.join(" ")
            );
            for (id, _) in &ranked {
                text.push_str(&format!("{id}\n"));
            }
            std::fs::write(out, text)?;
            println!("{} ids ranked from {} tokens into {out}", ranked.len(), ids.len());
        }
        [cmd, model, results, rest @ ..] if cmd == "check" => {
            let sizes: Vec<usize> = match rest.first() {
                Some(list) => list.split(',').map(str::parse).collect::<Result<_, _>>()?,
                None => vec![8192, 16384, 32768, 65536],
            };
            let ranking = match rest.get(1) {
                Some(path) => HeadVocab::read_ranking(path.as_ref())?,
                None => Vec::new(),
            };
            let tokenizer = Tokenizer::from_gguf_file(model.as_ref())?;
            let ids = output_ids(&tokenizer, std::slice::from_ref(results))?;
            let vocab = tokenizer.vocab_size();
            println!("{} output tokens", ids.len());
            let mut missed = Vec::new();
            for &n in &sizes {
                let head = HeadVocab { size: n, ranking: ranking.clone() };
                let mut kept = vec![false; vocab];
                for id in head.ids(vocab, tokenizer.special_token_ids()) {
                    kept[id as usize] = true;
                }
                let (scored, out): (Vec<u32>, Vec<u32>) = ids.iter().partition(|&&id| kept[id as usize]);
                println!(
                    "N {n:>6}: {:.3}% of tokens in the head",
                    100.0 * scored.len() as f64 / ids.len().max(1) as f64
                );
                missed = out;
            }
            for (id, count) in by_count(missed.into_iter()).iter().take(15) {
                println!(
                    "  missed by the largest: id {id:>6} ×{count:<5} {:?}",
                    tokenizer.token_text(*id).unwrap_or_default()
                );
            }
        }
        _ => {
            return Err("usage: head_coverage rank <model.gguf> <ranking.txt> <results.jsonl>… | \
                         head_coverage check <model.gguf> <results.jsonl> [N,N,… [ranking.txt]]"
                .into());
        }
    }
    Ok(())
}
