//! Benchmark (prints figures; not a test) of rendering instructions at the real checkpoint's
//! sizes: tokenizer load, render of one instruction with the real template (2 cameras of
//! 14x14 pooled patches with column tokens, 8 state dims), and the gather of its rows from a
//! memory-mapped bf16 embedding table `[V, 2560]` with the resident memory it adds.
//!
//!     cargo run --release -p vla-text --example text_bench -- TOKENIZER.json [TABLE.npy]
//!
//! TABLE.npy: a u16 (bf16 bit patterns) `[V, 2560]` table; without it only the render runs.

use std::time::Instant;
use vla_text::molmoact2::Template;

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let before = rss_kb();
    let t = Instant::now();
    let tok = vla_text::Tokenizer::from_files(std::path::Path::new(&args[0]), None).unwrap();
    println!(
        "tokenizer load {:.1} ms, RSS +{} MB",
        t.elapsed().as_secs_f64() * 1e3,
        (rss_kb() - before) / 1024
    );
    let template = Template::libero(2, (14, 14), 8);
    let texts = [
        "put the black bowl on the plate",
        "Open the top drawer of the cabinet and put the bowl inside.",
        "pick up the alphabet soup and place it in the basket",
    ];
    let mut ids = vec![];
    for (i, text) in texts.iter().cycle().take(30).enumerate() {
        let t = Instant::now();
        let r = template.render(&tok, text).unwrap();
        if i < 3 || i == 29 {
            println!(
                "render {:?}: {} tokens in {:.3} ms",
                text,
                r.ids.len(),
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        ids = r.ids;
    }
    let Some(table) = args.get(1) else { return };
    let before = rss_kb();
    let t = Instant::now();
    let m = vla_npz::MappedNpy::open(table).unwrap();
    let (v, d) = (m.shape()[0], m.shape()[1]);
    println!(
        "table {} x {} {} ({} MB) mapped={} in {:.2} ms, RSS +{} MB",
        v,
        d,
        m.dtype().name(),
        m.data().len() >> 20,
        m.is_mapped(),
        t.elapsed().as_secs_f64() * 1e3,
        (rss_kb() - before) / 1024
    );
    let t = Instant::now();
    let mut scaffold = vec![0f32; ids.len() * d];
    for (row, &id) in scaffold.chunks_exact_mut(d).zip(&ids) {
        let bytes = &m.data()[id as usize * d * 2..(id as usize + 1) * d * 2];
        for (o, b) in row.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
        }
    }
    println!(
        "scaffold of {} rows gathered in {:.2} ms; RSS now +{} MB over the mapping (the rows touched, and the {} MB scaffold)",
        ids.len(),
        t.elapsed().as_secs_f64() * 1e3,
        (rss_kb() - before) / 1024,
        (scaffold.len() * 4) >> 20
    );
}
