//! `Op::MoeFfn` on the CPU allocates nothing in a decode step once warm: its logits,
//! routes and per-expert matrices stay in per-thread scratch between calls (counted by a
//! global allocator that counts every allocation of the process while the op runs).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use flm_core::{
    BaseDevice, Data, DataType, Expert, ExpertGroups, GroupScore, MoeRouting, Op, RouterScoring,
};
use flm_devices::CpuDevice;

/// The system allocator, counting allocations and reallocations.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made while `MoeFfn` runs on `device` over `input` (validated beforehand).
fn allocations(
    device: &CpuDevice,
    input: &Data,
    router: &Data,
    experts: &[Expert],
    routing: MoeRouting<'_>,
    output: &mut Data,
) -> usize {
    let op = Op::MoeFfn {
        input,
        router,
        experts,
        first_expert: 0,
        routing,
        activation: flm_core::ExpertActivation::SwiGlu,
        output,
    }
    .validate()
    .unwrap();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    device.run(op).unwrap();
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

/// After one prefill (7 rows) and one decode step, 20 more decode steps with fresh inputs
/// (so other experts are chosen) allocate nothing, for float and int4 experts, with
/// Mixtral's routing and with DeepSeek-V3's (sigmoid scores, a choice bias, groups); the
/// first call does allocate (the counter sees the op's allocations). One thread of rayon,
/// so that every kernel's per-thread scratch is the one warmed.
#[test]
fn decode_steps_allocate_nothing_once_warm() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        let (n_experts, dim, inner) = (16, 256, 128);
        let bias = f32_data(&[n_experts], &uniform(&mut rng(0x5b), n_experts, 0.2));
        let deepseek_v3 = MoeRouting {
            scoring: RouterScoring::Sigmoid,
            groups: Some(ExpertGroups {
                n_groups: 4,
                top_groups: 2,
                score: GroupScore::SumOfTop2,
            }),
            choice_bias: Some(&bias),
            scale: 2.5,
            ..MoeRouting::softmax(4, true)
        };
        let cases = [DataType::F32, DataType::I4G32]
            .into_iter()
            .flat_map(|d| [(d, MoeRouting::softmax(4, true)), (d, deepseek_v3)]);
        for (dtype, routing) in cases {
            let mut rng = rng(0x5a);
            let (router, _) = random_f32(&mut rng, &[n_experts, dim], 0.2);
            let experts = random_experts(&mut rng, n_experts, (dim, inner), dtype);
            let device = CpuDevice::new().unwrap();
            let (prefill, _) = random_f32(&mut rng, &[7, dim], 1.0);
            let mut out = nan_output(&[7, dim]);
            let first = allocations(&device, &prefill, &router, &experts, routing, &mut out);
            if dtype == DataType::F32 {
                assert!(
                    first > 0,
                    "the first call allocated nothing: is the counter on?"
                );
            }
            let mut out = nan_output(&[1, dim]);
            let steps: Vec<Data> = (0..21)
                .map(|_| random_f32(&mut rng, &[1, dim], 1.0).0)
                .collect();
            allocations(&device, &steps[0], &router, &experts, routing, &mut out);
            for (i, x) in steps[1..].iter().enumerate() {
                let count = allocations(&device, x, &router, &experts, routing, &mut out);
                let what = format!("{dtype}, {:?}", routing.scoring);
                assert_eq!(count, 0, "{what}: decode step {i} allocated {count} times");
                assert!(out.as_f32().unwrap().iter().all(|v| v.is_finite()));
            }
        }
    });
}
