//! Sharded and mixed-precision training, per rank: what one GPU of a data-parallel job holds.
//!
//! A meta run records one process's step at the working precision (the dtype activations are
//! computed in). [`per_rank_trace`] turns that trace into one rank's: model-state allocations
//! (parameters, gradients, optimizer state) scaled to their precision and divided among ranks as
//! the ZeRO stage says, the fp32 master copies of mixed precision added, and under ZeRO-3 the
//! gathered parameters of the layer being computed; activations and temporaries stay as recorded
//! (data parallelism gives each rank its own micro-batch). The result is replayed through the
//! caching allocator model like any trace, so the figures include rounding and fragmentation.
//!
//! Model states per rank follow DeepSpeed's own estimators
//! (`deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs` and
//! `stage3.estimate_zero3_model_states_mem_needs`, without offload), generalised from their
//! fp16-with-Adam case to other precisions and optimizers:
//!
//! | stage | working params | working grads | master params + fp32 grads + optimizer state |
//! |-------|----------------|---------------|----------------------------------------------|
//! | none  | `eP`           | `eP`          | `(m + sP)`                                   |
//! | zero1 | `eP`           | `eP`          | `(m + sP) / N`                               |
//! | zero2 | `eP`           | `eP / N`      | `(m + sP) / N`                               |
//! | zero3 | `eP / N`       | in the gathered layer (amp) or `eP / N` | `(m + sP) / N` + gathered `2eL` |
//!
//! with `P` parameters, `N` ranks, `e` bytes per working element (4 fp32, 2 bf16/fp16), `s` bytes
//! of optimizer state per parameter (Adam: two states, 4 bytes each in fp32 and mixed precision, 2
//! in pure bf16), `m` = 8 bytes per parameter under mixed precision (fp32 master weight and fp32
//! gradient partition, which DeepSpeed counts in its 16 bytes per parameter) and 0 otherwise, and
//! `L` the parameters of the largest layer (DeepSpeed: the most parameters one module holds
//! directly; here the largest parameter tensor, which a layer's weight is). For fp16 Adam these are
//! DeepSpeed's current counts: ZeRO-2 `2P + 18P/N` (its 18 bytes: 16-bit gradients, fp32
//! gradients, fp32 parameters and two fp32 states, all partitioned; deepspeedai/DeepSpeed#5099
//! moved the 16-bit gradients from the replicated `4P` into the partitioned share) and ZeRO-3
//! `4L + 18P/N`; ZeRO-1 keeps the 16-bit gradients whole, `4P + 16P/N`. The reduce buckets
//! stages 1 and 2 fill while backward runs are transient and not modelled.
use serde::Serialize;

use crate::options::{choice, Optimizer, Precision};
use gpu_mem_track_log::{Category, Phase, Trace, TraceEvent};

/// How model states are divided among data-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Shard {
    /// Plain data parallelism (DDP): every rank holds everything.
    #[default]
    None,
    /// ZeRO-1: optimizer state (and mixed precision's master weights) divided among ranks.
    Zero1,
    /// ZeRO-2: as ZeRO-1, gradients reduced to their owner and divided too (see the module docs).
    Zero2,
    /// ZeRO-3 / FSDP full shard: parameters, gradients and optimizer state divided, each layer's
    /// parameters gathered while it computes.
    Zero3,
}

/// Precision of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrainingPrecision {
    /// Everything float32.
    #[default]
    Fp32,
    /// Everything float16 (parameters, gradients, optimizer state, activations).
    Fp16,
    /// Everything bfloat16 (parameters, gradients, optimizer state, activations).
    Bf16,
    /// Mixed precision: bfloat16 working weights, gradients and activations; fp32 master weights,
    /// gradient partition and optimizer state.
    AmpBf16,
    /// As `amp-bf16` with float16.
    AmpFp16,
}

choice!(Shard, "sharding" {
    Shard::None => "none" | "ddp"; "Plain data parallelism (DDP): every rank holds everything",
    Shard::Zero1 => "zero1"; "ZeRO-1: optimizer state (and mixed precision's master weights) divided among ranks",
    Shard::Zero2 => "zero2"; "ZeRO-2: as ZeRO-1, gradients reduced to their owner",
    Shard::Zero3 => "zero3" | "fsdp"; "ZeRO-3 / FSDP full shard: parameters, gradients and optimizer state divided",
});
choice!(TrainingPrecision, "training precision" {
    TrainingPrecision::Fp32 => "fp32" | "f32" | "float32"; "Everything float32",
    TrainingPrecision::Fp16 => "fp16" | "f16" | "float16" | "half"; "Everything float16 (parameters, gradients, optimizer state, activations)",
    TrainingPrecision::Bf16 => "bf16" | "bfloat16"; "Everything bfloat16 (parameters, gradients, optimizer state, activations)",
    TrainingPrecision::AmpBf16 => "amp-bf16"; "Mixed precision: bfloat16 weights, gradients and activations; fp32 master weights and optimizer state",
    TrainingPrecision::AmpFp16 => "amp-fp16" | "amp-f16"; "As amp-bf16 with float16",
});

impl TrainingPrecision {
    /// The precision the model computes in: what the meta run uses.
    pub fn working(self) -> Precision {
        match self {
            TrainingPrecision::Fp32 => Precision::F32,
            TrainingPrecision::Bf16 | TrainingPrecision::AmpBf16 => Precision::Bf16,
            TrainingPrecision::Fp16 | TrainingPrecision::AmpFp16 => Precision::F16,
        }
    }

    /// Mixed precision: fp32 master weights beside the working ones, which a meta run of the
    /// model does not hold.
    pub fn mixed(self) -> bool {
        matches!(self, TrainingPrecision::AmpBf16 | TrainingPrecision::AmpFp16)
    }

    /// Bytes of a working element.
    pub fn working_bytes(self) -> u64 {
        if self == TrainingPrecision::Fp32 {
            4
        } else {
            2
        }
    }

    /// Bytes of one optimizer-state element: fp32 except in pure bf16 or fp16.
    fn state_bytes(self) -> u64 {
        if matches!(self, TrainingPrecision::Bf16 | TrainingPrecision::Fp16) {
            2
        } else {
            4
        }
    }
}

/// One rank of a data-parallel job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Parallelism {
    /// Ranks (GPUs) sharing the model states.
    pub world_size: u64,
    /// How they share them.
    pub shard: Shard,
    /// Precision of the step.
    pub precision: TrainingPrecision,
}

impl Default for Parallelism {
    fn default() -> Self {
        Parallelism { world_size: 1, shard: Shard::None, precision: TrainingPrecision::Fp32 }
    }
}

impl Parallelism {
    /// The job these options describe, when they describe one: several ranks, sharded model
    /// states or mixed precision. `None`: figures are one process's, as the step ran. The command
    /// line and Python both ask this.
    pub fn asked(world_size: u64, shard: Shard, precision: TrainingPrecision) -> Option<Parallelism> {
        let asked = precision.mixed() || world_size > 1 || shard != Shard::None;
        asked.then_some(Parallelism { world_size: world_size.max(1), shard, precision })
    }

    /// [`Parallelism::asked`] for a run recorded as it ran (Python's `Estimator`): only several
    /// ranks or sharded states make a job of it. The program already ran in its own dtype,
    /// autocast included, so a precision alone changes nothing the recording does not hold.
    pub fn asked_of_recorded_run(
        world_size: u64,
        shard: Shard,
        precision: TrainingPrecision,
    ) -> Option<Parallelism> {
        Parallelism::asked(world_size, shard, precision)
            .filter(|p| p.world_size > 1 || p.shard != Shard::None)
    }
}

/// Model-state bytes one rank holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ModelStates {
    /// Working-precision parameters.
    pub parameters: u64,
    /// Working-precision gradients kept between backward and the step.
    pub gradients: u64,
    /// Optimizer state, with mixed precision's fp32 master weights and gradient partition.
    pub optimizer: u64,
    /// ZeRO-3: the gathered parameters and gradients of the layer being computed.
    pub gathered_layer: u64,
}

impl ModelStates {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.parameters + self.gradients + self.optimizer + self.gathered_layer
    }
}

fn optimizer_states(optimizer: Optimizer) -> u64 {
    match optimizer {
        Optimizer::Sgd => 0,
        Optimizer::SgdMomentum => 1,
        Optimizer::Adam | Optimizer::AdamW => 2,
    }
}

/// `a * b / n`, rounded up, without overflow for any parameter count.
fn share(a: u64, b: u64, n: u64) -> u64 {
    let v = (a as u128 * b as u128).div_ceil(n.max(1) as u128);
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Model states per rank for `params` parameters whose largest layer has `largest_layer`.
pub fn model_states(params: u64, largest_layer: u64, optimizer: Optimizer, p: &Parallelism) -> ModelStates {
    let e = p.precision.working_bytes();
    let n = p.world_size.max(1);
    let per_param_optimizer =
        if p.precision.mixed() { 8 } else { 0 } + optimizer_states(optimizer) * p.precision.state_bytes();
    match p.shard {
        Shard::None => ModelStates {
            parameters: share(params, e, 1),
            gradients: share(params, e, 1),
            optimizer: share(params, per_param_optimizer, 1),
            gathered_layer: 0,
        },
        Shard::Zero1 | Shard::Zero2 => ModelStates {
            parameters: share(params, e, 1),
            gradients: share(params, e, if p.shard == Shard::Zero2 { n } else { 1 }),
            optimizer: share(params, per_param_optimizer, n),
            gathered_layer: 0,
        },
        Shard::Zero3 => ModelStates {
            parameters: share(params, e, n),
            gradients: if p.precision.mixed() { 0 } else { share(params, e, n) },
            optimizer: share(params, per_param_optimizer, n),
            gathered_layer: share(largest_layer, 2 * e, 1),
        },
    }
}

/// What [`per_rank_trace`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RankPlan {
    /// The job.
    pub parallelism: Parallelism,
    /// Parameters seen in the trace (elements).
    pub parameters: u64,
    /// The largest parameter tensor (elements): the layer ZeRO-3 gathers.
    pub largest_layer: u64,
    /// Model states per rank by the formulas of the module docs.
    pub model_states: ModelStates,
}

/// One rank's trace of a step recorded at `p.precision.working()`: see the module docs. Training
/// traces have gradient and optimizer-state events; an inference trace only gets its parameters
/// sharded (ZeRO-3 inference).
pub fn per_rank_trace(trace: &Trace, optimizer: Optimizer, p: &Parallelism) -> (Trace, RankPlan) {
    let e = p.precision.working_bytes();
    let n = p.world_size.max(1);
    let sharded_optimizer = p.shard != Shard::None;
    let params: Vec<&TraceEvent> =
        trace.events.iter().filter(|ev| ev.alloc && ev.category == Category::Parameter).collect();
    let param_count: u64 = params.iter().map(|ev| ev.size / e).sum();
    let largest_layer = params.iter().map(|ev| ev.size / e).max().unwrap_or(0);
    let states = model_states(param_count, largest_layer, optimizer, p);
    // Bytes per recorded byte of each kind, as (numerator, denominator).
    let scale = |ev: &TraceEvent| -> (u64, u64) {
        match ev.category {
            Category::Parameter if p.shard == Shard::Zero3 => (1, n),
            // Loading converts the file's tensors to the working dtype; under ZeRO-3 each rank
            // loads and converts only its shard (`zero.Init`, FSDP's sharded loading).
            _ if ev.phase == Phase::Load && p.shard == Shard::Zero3 => (1, n),
            Category::Gradient if p.shard == Shard::Zero3 && p.precision.mixed() => (0, 1),
            Category::Gradient if matches!(p.shard, Shard::Zero2 | Shard::Zero3) => (1, n),
            // Recorded at the working precision; held at the state precision, divided when sharded.
            Category::OptimizerState => {
                (p.precision.state_bytes(), e * if sharded_optimizer { n } else { 1 })
            }
            // The step runs on each rank's shard only: its temporaries shrink with it.
            Category::Temporary if ev.phase == Phase::Optimizer && sharded_optimizer => (1, n),
            _ => (1, 1),
        }
    };
    let mut next_id = trace.events.iter().map(|ev| ev.id).max().unwrap_or(0).saturating_add(1);
    let mut extra = |size: u64, phase: Phase, iteration: u32, category: Category, op: &str| {
        next_id += 1;
        TraceEvent {
            alloc: true,
            id: next_id,
            size,
            phase,
            iteration,
            op: op.into(),
            top_op: op.into(),
            category,
        }
    };
    let mut sizes = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(trace.events.len() + 8);
    let master =
        if p.precision.mixed() { share(param_count, 8, if sharded_optimizer { n } else { 1 }) } else { 0 };
    let mut master_added = false;
    let mut gathered: Option<TraceEvent> = None;
    for ev in &trace.events {
        // Mixed precision's fp32 master weights and gradient partition exist from the start of
        // training (the optimizer is built on them).
        if !master_added && master > 0 && ev.phase >= Phase::Forward {
            out.push(extra(master, Phase::Load, 0, Category::OptimizerState, "fp32 master weights"));
            master_added = true;
        }
        // ZeRO-3 gathers a layer at every forward and backward, and frees it for the step.
        if p.shard == Shard::Zero3 && states.gathered_layer > 0 {
            let computing = matches!(ev.phase, Phase::Forward | Phase::Backward);
            if computing && gathered.is_none() {
                let g =
                    extra(states.gathered_layer, ev.phase, ev.iteration, Category::Temporary, "zero3 gather");
                out.push(g.clone());
                gathered = Some(g);
            } else if !computing {
                if let Some(g) = gathered.take() {
                    out.push(TraceEvent { alloc: false, phase: ev.phase, ..g });
                }
            }
        }
        let mut ev = ev.clone();
        if ev.alloc {
            let (num, den) = scale(&ev);
            ev.size = share(ev.size, num, den);
            sizes.insert(ev.id, ev.size);
        } else if let Some(size) = sizes.remove(&ev.id) {
            ev.size = size;
        }
        out.push(ev);
    }
    let plan = RankPlan { parallelism: *p, parameters: param_count, largest_layer, model_states: states };
    (
        Trace {
            events: out,
            workspace_bounds: trace.workspace_bounds.clone(),
            communicators: trace.communicators,
        },
        plan,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeepSpeed's `estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node,
    /// num_nodes, cpu_offload=False)`: GPU bytes, as its source has it since
    /// deepspeedai/DeepSpeed#5099 (`2 * total_params + int(18 * total_params / total_gpus)`).
    fn deepspeed_zero2(total_params: u64, gpus: u64) -> u64 {
        2 * total_params + 18 * total_params / gpus
    }

    /// ZeRO-1, which DeepSpeed's estimator folds into stage 2: the 16-bit gradients whole.
    fn zero1(total_params: u64, gpus: u64) -> u64 {
        4 * total_params + 16 * total_params / gpus
    }

    /// DeepSpeed's `estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, ...,
    /// cpu_offload=False)`: GPU bytes.
    fn deepspeed_zero3(total_params: u64, largest_layer_params: u64, gpus: u64) -> u64 {
        4 * largest_layer_params + 18 * total_params / gpus
    }

    #[test]
    fn model_states_match_deepspeeds_estimators_for_fp16_adam() {
        let amp =
            |shard, world_size| Parallelism { world_size, shard, precision: TrainingPrecision::AmpFp16 };
        // (parameters, largest layer): a 125M GPT, Llama-2-7B (embedding 32000 x 4096), 70B.
        for (params, largest) in
            [(125_000_000u64, 38_597_376u64), (6_738_415_616, 131_072_000), (68_976_648_192, 262_144_000)]
        {
            for gpus in [1u64, 8, 64, 512] {
                let z2 = model_states(params, largest, Optimizer::AdamW, &amp(Shard::Zero2, gpus));
                let z3 = model_states(params, largest, Optimizer::Adam, &amp(Shard::Zero3, gpus));
                let z1 = model_states(params, largest, Optimizer::Adam, &amp(Shard::Zero1, gpus));
                assert!(z1.total().abs_diff(zero1(params, gpus)) <= 1, "{params} x {gpus}: {z1:?}");
                // DeepSpeed truncates the per-GPU share (int()); we round each part up: at most two
                // bytes apart.
                assert!(z2.total().abs_diff(deepspeed_zero2(params, gpus)) <= 2, "{params} x {gpus}: {z2:?}");
                assert!(
                    z3.total().abs_diff(deepspeed_zero3(params, largest, gpus)) <= 1,
                    "{params} x {gpus}: {z3:?}"
                );
            }
        }
        // Without sharding everything is per rank: 20 bytes per parameter (2 + 2 + 4 + 4 + 8).
        assert_eq!(model_states(1000, 10, Optimizer::Adam, &amp(Shard::None, 8)).total(), 20_000);
    }

    #[test]
    fn other_precisions_and_optimizers_scale_the_same_table() {
        let p = |precision, shard, world_size| Parallelism { world_size, shard, precision };
        // fp32 Adam: 4 + 4 + 8 = 16 bytes per parameter unsharded.
        assert_eq!(
            model_states(1000, 10, Optimizer::Adam, &p(TrainingPrecision::Fp32, Shard::None, 4)).total(),
            16_000
        );
        // ZeRO-3 fp32 SGD on 4 ranks: params and grads divided, a layer (params + grads) gathered.
        let z3 = model_states(1000, 10, Optimizer::Sgd, &p(TrainingPrecision::Fp32, Shard::Zero3, 4));
        assert_eq!(z3, ModelStates { parameters: 1000, gradients: 1000, optimizer: 0, gathered_layer: 80 });
        // Pure bf16 keeps Adam's state in bf16.
        let bf = model_states(1000, 10, Optimizer::AdamW, &p(TrainingPrecision::Bf16, Shard::Zero1, 2));
        assert_eq!(bf, ModelStates { parameters: 2000, gradients: 2000, optimizer: 2000, gathered_layer: 0 });
    }

    fn ev(alloc: bool, id: i64, size: u64, phase: Phase, category: Category) -> TraceEvent {
        TraceEvent {
            alloc,
            id,
            size,
            phase,
            iteration: 1,
            op: "aten::empty".into(),
            top_op: "aten::empty".into(),
            category,
        }
    }

    #[test]
    fn the_per_rank_trace_holds_the_model_states_of_the_table() {
        // A bf16 step of 3000 parameters (largest tensor 2000), AdamW.
        let t = Trace {
            events: vec![
                ev(true, 1, 4000, Phase::Load, Category::Parameter),
                ev(true, 2, 2000, Phase::Load, Category::Parameter),
                ev(true, 3, 500, Phase::Forward, Category::Activation),
                ev(true, 4, 4000, Phase::Backward, Category::Gradient),
                ev(true, 5, 2000, Phase::Backward, Category::Gradient),
                ev(false, 3, 500, Phase::Backward, Category::Activation),
                ev(true, 6, 8000, Phase::Optimizer, Category::OptimizerState),
                ev(true, 7, 4000, Phase::Optimizer, Category::OptimizerState),
                ev(true, 8, 600, Phase::Optimizer, Category::Temporary),
                ev(false, 8, 600, Phase::Optimizer, Category::Temporary),
            ],
            ..Trace::default()
        };
        for shard in [Shard::None, Shard::Zero1, Shard::Zero2, Shard::Zero3] {
            let p = Parallelism { world_size: 4, shard, precision: TrainingPrecision::AmpBf16 };
            let (rank, plan) = per_rank_trace(&t, Optimizer::AdamW, &p);
            assert_eq!((plan.parameters, plan.largest_layer), (3000, 2000));
            let mut kept = 0u64;
            for e in &rank.events {
                if e.alloc && e.category != Category::Activation && e.category != Category::Temporary {
                    kept += e.size;
                }
            }
            let s = plan.model_states;
            assert_eq!(kept, s.parameters + s.gradients + s.optimizer, "{shard:?}: {s:?}");
            // The activation is the rank's own micro-batch: never divided.
            assert!(rank.events.iter().any(|e| e.id == 3 && e.size == 500));
            if shard == Shard::Zero3 {
                assert_eq!(s.gathered_layer, 2000 * 4);
                assert!(rank.events.iter().any(|e| e.op == "zero3 gather" && e.size == 8000));
            }
        }
    }
}
