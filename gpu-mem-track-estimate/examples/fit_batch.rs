//! How large a batch fits a GPU? A 134-million-parameter decoder-only transformer built with
//! `tch::nn`, its training step searched with [`fit_training_step`]: meta runs (no GPU, no real
//! memory), each judged on a GPU profile with the cuBLAS workspace, cuDNN range and CUDA context.
//!
//! ```text
//! cargo run --release --example fit_batch -- --gpu-mem 24GiB [--profile rtx4090] [--seq 512]
//! ```
use anyhow::{bail, Context, Result};
use gpu_mem_track_estimate::fit::{budget, fit_training_step, parse_memory_size, FitDimension};
use gpu_mem_track_estimate::profile::DeviceProfile;
use gpu_mem_track_estimate::{EstimateDevice, Optimizer, Precision, TchStepOptions};
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

const VOCAB: i64 = 32_000;
const D: i64 = 768;
const HEADS: i64 = 12;
const LAYERS: i64 = 12;

struct Block {
    ln1: nn::LayerNorm,
    qkv: nn::Linear,
    proj: nn::Linear,
    ln2: nn::LayerNorm,
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl Block {
    fn new(p: &nn::Path) -> Self {
        Block {
            ln1: nn::layer_norm(p / "ln1", vec![D], Default::default()),
            qkv: nn::linear(p / "qkv", D, 3 * D, Default::default()),
            proj: nn::linear(p / "proj", D, D, Default::default()),
            ln2: nn::layer_norm(p / "ln2", vec![D], Default::default()),
            fc1: nn::linear(p / "fc1", D, 4 * D, Default::default()),
            fc2: nn::linear(p / "fc2", 4 * D, D, Default::default()),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let (b, t, _) = x.size3().expect("[batch, seq, d]");
        let qkv = self.qkv.forward(&self.ln1.forward(x)).split(D, 2);
        let heads = |z: &Tensor| z.view([b, t, HEADS, D / HEADS]).transpose(1, 2);
        let a = Tensor::scaled_dot_product_attention(
            &heads(&qkv[0]),
            &heads(&qkv[1]),
            &heads(&qkv[2]),
            None::<Tensor>,
            0.0,
            true,
            None,
            false,
        );
        let x = x + self.proj.forward(&a.transpose(1, 2).reshape([b, t, D]));
        let h = self.fc2.forward(&self.fc1.forward(&self.ln2.forward(&x)).gelu("none"));
        x + h
    }
}

struct Gpt {
    tok: nn::Embedding,
    pos: nn::Embedding,
    blocks: Vec<Block>,
    ln: nn::LayerNorm,
    head: nn::Linear,
}

impl Gpt {
    fn new(p: &nn::Path, ctx: i64) -> Self {
        Gpt {
            tok: nn::embedding(p / "tok", VOCAB, D, Default::default()),
            pos: nn::embedding(p / "pos", ctx, D, Default::default()),
            blocks: (0..LAYERS).map(|i| Block::new(&(p / "blocks" / i))).collect(),
            ln: nn::layer_norm(p / "ln", vec![D], Default::default()),
            head: nn::linear(p / "head", D, VOCAB, nn::LinearConfig { bias: false, ..Default::default() }),
        }
    }

    fn loss(&self, ids: &Tensor, targets: &Tensor) -> Tensor {
        let t = ids.size()[1];
        // Positions are made from the input (on its device, meta here), not from a fixed device.
        let positions = ids.ones_like().cumsum(1, Kind::Int64) - 1;
        let mut x = self.tok.forward(ids) + self.pos.forward(&positions.narrow(1, 0, t));
        for b in &self.blocks {
            x = b.forward(&x);
        }
        let logits = self.head.forward(&self.ln.forward(&x));
        logits.view([-1, VOCAB]).cross_entropy_for_logits(&targets.view([-1]))
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<()> {
    let gpu_mem = arg("--gpu-mem").map(|s| parse_memory_size(&s)).transpose().map_err(anyhow::Error::msg)?;
    let profile =
        budget(&DeviceProfile::find(&arg("--profile").unwrap_or_else(|| "rtx4090".into()))?, gpu_mem);
    let seq: i64 = arg("--seq").map(|s| s.parse()).transpose().context("--seq")?.unwrap_or(512);
    if seq < 1 {
        bail!("--seq must be at least 1");
    }
    println!(
        "decoder-only transformer: {LAYERS} layers, d={D}, vocab={VOCAB}, sequence {seq}; AdamW; {} with {:.1} GiB",
        profile.name,
        profile.memory_bytes as f64 / (1u64 << 30) as f64
    );
    let options = TchStepOptions {
        input_shape: vec![1, seq],
        input_is_index: true,
        target_shape: vec![1, seq],
        precision: Precision::F32,
        optimizer: Optimizer::AdamW,
        device: EstimateDevice::Meta,
    };
    let start = std::time::Instant::now();
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let r = fit_training_step(
        |p| Gpt::new(p, seq),
        |m, x, y| m.loss(x, y),
        &options,
        FitDimension::Batch,
        &profile,
        4096,
        |p| {
            println!(
                "  batch {:>5}: nvidia-smi up to {:>9.0} MiB  {}",
                p.value,
                mib(p.needed),
                if p.fits { "fits" } else { "too large" }
            )
        },
    )?;
    match r.largest {
        None => println!("not even batch 1 fits"),
        Some(b) => println!(
            "largest batch that fits: {b} (peak allocated up to {:.0} MiB; {} meta runs in {:.1} s on this CPU, no GPU used)",
            mib(r.prediction.peak_allocated.high),
            r.probes.len(),
            start.elapsed().as_secs_f64()
        ),
    }
    Ok(())
}
