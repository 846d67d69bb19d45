//! The decode steps of one [`super::Llama`] captured as step graphs
//! ([`flm_core::StepGraph`]: CUDA graphs on the GPU), one per batch size.
//!
//! A batch size's first step runs op by op, which warms the device up (its kernels loaded,
//! RoPE tables and cuBLAS ready, as PyTorch's CUDA graph guide asks before a capture); its
//! second is captured and replayed; every later one is replayed. The graphs hold the
//! addresses of the instance's KV cache and activations, so they live and die with the
//! instance, and a model placed elsewhere is a new instance without any.

use flm_core::StepGraph;

/// What to do with a step of a given batch size.
#[derive(Debug)]
pub(crate) enum StepPlan<'g> {
    /// Run it op by op (the batch size's first step).
    Eager,
    /// Capture it ([`flm_core::Executor::capture`]), then keep the graph with
    /// [`StepGraphs::insert`].
    Capture,
    /// Replay this graph ([`flm_core::Executor::replay`]).
    Replay(&'g StepGraph),
}

/// Per batch size: warmed up, then captured.
#[derive(Debug, Default)]
pub(crate) struct StepGraphs {
    /// Batch sizes that ran their warm-up step, with their graph once captured.
    slots: Vec<(usize, Option<StepGraph>)>,
}

impl StepGraphs {
    /// What a step of `batch` rows does now; the first call for a batch size counts as its
    /// warm-up.
    pub fn plan(&mut self, batch: usize) -> StepPlan<'_> {
        match self.slots.iter().position(|(b, _)| *b == batch) {
            None => {
                self.slots.push((batch, None));
                StepPlan::Eager
            }
            Some(i) => match &self.slots[i].1 {
                None => StepPlan::Capture,
                Some(graph) => StepPlan::Replay(graph),
            },
        }
    }

    /// Keeps the graph captured for its batch size, replacing any before it.
    pub fn insert(&mut self, graph: StepGraph) {
        let batch = graph.batch();
        match self.slots.iter_mut().find(|(b, _)| *b == batch) {
            Some(slot) => slot.1 = Some(graph),
            None => self.slots.push((batch, Some(graph))),
        }
    }

    /// The batch sizes with a captured graph, in the order they were first seen.
    pub fn captured(&self) -> Vec<usize> {
        (self.slots.iter())
            .filter(|(_, g)| g.is_some())
            .map(|(b, _)| *b)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flm_core::recording::RecordingDevice;
    use flm_core::{Executor, Location, StepInputs};
    use flm_devices::SimDevice;

    const AT: Location = Location::Device {
        name: "sim",
        ordinal: 0,
    };

    fn graph(exec: &Executor, tokens: &[u32]) -> StepGraph {
        let step = StepInputs {
            tokens,
            start_pos: 1,
            cache_row: 1,
        };
        exec.capture(AT, &step, || Ok::<_, flm_core::Error>(()))
            .unwrap()
    }

    #[test]
    fn each_batch_size_warms_up_then_captures_then_replays() {
        let device = RecordingDevice::new(SimDevice::new(0).unwrap());
        let exec = Executor::with_profiling(vec![Box::new(device)], false);
        let mut graphs = StepGraphs::default();
        assert!(matches!(graphs.plan(1), StepPlan::Eager));
        assert!(matches!(graphs.plan(1), StepPlan::Capture));
        // Until a graph is kept, the batch size keeps asking for a capture.
        assert!(matches!(graphs.plan(1), StepPlan::Capture));
        graphs.insert(graph(&exec, &[3]));
        assert!(matches!(graphs.plan(1), StepPlan::Replay(g) if g.batch() == 1));
        // Another batch size starts over, without touching the first.
        assert!(matches!(graphs.plan(4), StepPlan::Eager));
        assert!(matches!(graphs.plan(4), StepPlan::Capture));
        graphs.insert(graph(&exec, &[1, 2, 3, 4]));
        assert!(matches!(graphs.plan(4), StepPlan::Replay(g) if g.batch() == 4));
        assert!(matches!(graphs.plan(1), StepPlan::Replay(g) if g.batch() == 1));
        assert_eq!(graphs.captured(), [1, 4]);
        // A graph kept again for a batch size replaces the first.
        graphs.insert(graph(&exec, &[9]));
        assert_eq!(graphs.captured(), [1, 4]);
    }
}
