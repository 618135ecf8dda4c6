//! One estimate, the same behind every front end. The command line's `estimate` and Python's
//! `Estimator` each record a run their own way (a model file run by libtorch, a program run in
//! process), then hand it here with what they were asked ([`EstimateRequest`]); what comes back
//! ([`EstimateReport`]) gives the JSON, the text and the GPU prediction. The front ends only
//! translate options and print: a new option of an estimate is added here, once.
use std::path::Path;

use gpu_mem_track_gpu::options::Mode;
use gpu_mem_track_gpu::profile::GpuPrediction;
use gpu_mem_track_gpu::sharding::{per_rank_trace, Parallelism};
use gpu_mem_track_log::log::GroupLine;
use gpu_mem_track_log::{Category, Trace};
use serde::Serialize;

use crate::estimate::Estimate;
use crate::figures::StaticEstimate;
use crate::gpu_target::GpuTarget;
use crate::text::{
    estimate_json, mib, EstimateSummary, GpuReport, GpuTable, PeakBreakdown, PeakTensors, RankReport,
};
use gpu_mem_track_gpu::options::{EstimateDevice, Optimizer};

/// What an estimate's figures are for, besides the run itself.
#[derive(Debug, Clone, PartialEq)]
pub struct EstimateRequest {
    /// The GPUs to predict for (`--device-profile`, Python's `device`).
    pub gpu: GpuTarget,
    /// One rank of a data-parallel job: its figures stand for the GPU's. `None`: one process.
    pub parallelism: Option<Parallelism>,
    /// Whether the text ends the summary with the caching allocator model's line (`none` asks
    /// for no CUDA figures at all).
    pub caching_allocator_line: bool,
}

/// Bytes one module held in one category at the peak (an in-process run's `breakdown`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModuleBytes {
    /// The module's path in the model (`encoder.layer.0`; empty: outside any module).
    pub module: String,
    /// What the bytes hold.
    pub category: Category,
    /// Live bytes.
    pub bytes: u64,
}

/// What one run recorded, however it ran.
#[derive(Debug, Clone)]
pub struct RecordedRun {
    /// The run's figures.
    pub estimate: Estimate,
    /// Its categorised trace.
    pub trace: Trace,
    /// The live tensors at its peak, grouped as in the log, when they were walked.
    pub peak_tensors: Option<Vec<GroupLine>>,
    /// What each module held at the peak (in-process runs).
    pub breakdown: Option<Vec<ModuleBytes>>,
    /// The static estimate of the same model, when asked for (`--method both`).
    pub static_estimate: Option<StaticEstimate>,
}

/// A recorded run with its predictions: the one result every front end shows.
#[derive(Debug, Clone)]
pub struct EstimateReport {
    run: RecordedRun,
    /// One rank's trace and its report, for a data-parallel job.
    rank: Option<(Trace, RankReport)>,
    gpus: Vec<GpuPrediction>,
    one_gpu: bool,
    caching_allocator_line: bool,
}

impl EstimateReport {
    /// Predicts `run` for what `request` asks: one rank's trace for a data-parallel job (the
    /// optimizer states of the run's own optimizer; none for inference), then the GPU figures of
    /// that trace.
    pub fn new(run: RecordedRun, request: &EstimateRequest) -> Self {
        let optimizer = match run.estimate.options.mode {
            Mode::Train(o) => o,
            Mode::Inference => Optimizer::Sgd,
        };
        let rank = request.parallelism.map(|p| {
            let (trace, plan) = per_rank_trace(&run.trace, optimizer, &p);
            let report = RankReport::new(&trace, plan);
            (trace, report)
        });
        let gpus = request.gpu.predictions(rank.as_ref().map_or(&run.trace, |(t, _)| t));
        EstimateReport {
            run,
            rank,
            gpus,
            one_gpu: matches!(request.gpu, GpuTarget::One(_)),
            caching_allocator_line: request.caching_allocator_line,
        }
    }

    /// The run's figures.
    pub fn estimate(&self) -> &Estimate {
        &self.run.estimate
    }

    /// The trace the GPU figures replay: one rank's for a data-parallel job, else the run's.
    pub fn gpu_trace(&self) -> &Trace {
        self.rank.as_ref().map_or(&self.run.trace, |(t, _)| t)
    }

    /// The prediction for the one GPU asked for (`None` for `cuda`, `none` and `all`).
    pub fn prediction(&self) -> Option<&GpuPrediction> {
        self.gpus.first().filter(|_| self.one_gpu)
    }

    /// `estimate --json`'s object: the estimate's figures, with `rank`, `gpu` or `gpus`, `static`
    /// and `breakdown` when present. Python's `estimate()` returns the same object.
    ///
    /// # Errors
    /// A figure serde cannot represent (never for finite figures).
    pub fn json(&self) -> serde_json::Result<serde_json::Value> {
        let rank = self.rank.as_ref().map(|(_, r)| r);
        let mut v = estimate_json(
            &self.run.estimate,
            rank,
            &self.gpus,
            self.one_gpu,
            self.run.static_estimate.as_ref(),
        )?;
        if let Some(b) = &self.run.breakdown {
            v["breakdown"] = serde_json::to_value(b)?;
        }
        Ok(v)
    }

    /// The text `estimate` prints, each line ending in `\n`; the summary after `model`'s name
    /// when given.
    pub fn text(&self, model: Option<&Path>) -> String {
        let e = &self.run.estimate;
        let mut text =
            EstimateSummary { model, estimate: e, with_cuda: self.caching_allocator_line }.to_string();
        text.push_str(&PeakBreakdown { estimate: e, trace: &self.run.trace }.to_string());
        // On the CPU, oneDNN's own allocations are in the peak but not in the registry.
        if let (Some(groups), EstimateDevice::Meta) = (&self.run.peak_tensors, e.options.device) {
            text.push_str(&PeakTensors { groups, estimate: e }.to_string());
        }
        if let Some((_, r)) = &self.rank {
            text.push_str(&r.to_string());
        }
        match self.prediction() {
            Some(g) => text.push_str(&GpuReport(g).to_string()),
            None if !self.gpus.is_empty() => text.push_str(&GpuTable(&self.gpus).to_string()),
            None => {}
        }
        if let Some(s) = &self.run.static_estimate {
            let name = model.map(|m| m.display().to_string()).unwrap_or_default();
            let (a, b) = (e.activation_peak() as f64, s.activation_peak as f64);
            text.push_str(&format!(
                "{name} {s}  comparison: activation peak meta {} vs static {} ({:+.1} %)\n",
                mib(e.activation_peak()),
                mib(s.activation_peak),
                if a > 0.0 { (b - a) / a * 100.0 } else { 0.0 }
            ));
        }
        text
    }
}
