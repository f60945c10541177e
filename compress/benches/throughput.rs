//! Single-thread throughput of every operator: `compress` and `decode_add`, in GB/s of
//! input (`4·d` bytes of `f32`), next to a `memcpy` of the same buffer.
//!
//! ```text
//! cargo bench -p murmur-compress --bench throughput                 # everything (a few minutes)
//! cargo bench -p murmur-compress --bench throughput -- 25600000     # only d = 25.6M
//! cargo bench -p murmur-compress --bench throughput -- 'compress/topk'
//! python3 compress/benches/table.py                                 # markdown table of the run
//! ```
//!
//! Benchmark ids are `d=<d>/<compress|decode_add|memcpy>/<operator>`; the argument after
//! `--` is criterion's filter (a regular expression matched against the id).
//!
//! Input: `d` standard-normal `f32` drawn from a fixed seed, for d = 2²⁰ and d = 25,600,000
//! (ResNet-50's parameter count). `compress` appends to one output `Vec` (cleared, capacity
//! kept, each iteration); `decode_add` adds `⅓ · C(x)` of one message, made once, into one
//! accumulator (the gossip receive path). The d = 25.6M input is also written to
//! `<target>/bench-data/normal-25600000.f32` (raw little-endian `f32`) so that other tools
//! (`numpy_topk.py`) measure the same data. `<target>` is found as criterion finds it:
//! `CARGO_TARGET_DIR`, else the cargo target directory that holds this executable.
//!
//! An operator whose messages do not decode (a placeholder build) is reported and skipped.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use murmur_compress::{
    decode_add, validate, ApproxTopK, Bf16, Compressor, Fp16, Identity, Natural, Qsgd, RandK, Sign,
    SparseLoco, TernGrad, TopK,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

/// Vector lengths: 2²⁰, and ResNet-50's parameter count.
const DIMS: [usize; 2] = [1 << 20, 25_600_000];
/// The length whose input is written to `bench-data/` for the numpy comparison.
const DUMP_DIM: usize = 25_600_000;
/// Seed of the input data; the operators' RNG uses `SEED + 1`.
const SEED: u64 = 0x6d75_726d_7572;
/// Receive-side weight (a gossip weight `W_ij` of a degree-2 ring).
const SCALE: f32 = 1.0 / 3.0;

type Make = fn() -> Box<dyn Compressor>;

/// The operators, by the name used in benchmark ids.
const OPERATORS: [(&str, Make); 12] = [
    ("identity", || Box::new(Identity)),
    ("topk-1%", || Box::new(TopK::new(0.01))),
    ("approx-topk-1%", || Box::new(ApproxTopK::new(0.01))),
    ("randk-1%-scaled", || Box::new(RandK::new(0.01, true))),
    ("qsgd-s15-b512", || Box::new(Qsgd::new(15, 512))),
    ("sign", || Box::new(Sign::new(None))),
    ("terngrad", || Box::new(TernGrad::new(None))),
    ("natural", || Box::new(Natural::new())),
    ("fp16", || Box::new(Fp16::default())),
    ("bf16", || Box::new(Bf16::default())),
    ("sparseloco-1/64", || {
        Box::new(SparseLoco::new(1.0 / 64.0, 4096))
    }),
    ("sparseloco-30%", || Box::new(SparseLoco::new(0.3, 4096))),
];

/// `d` standard-normal values from the fixed seed.
fn gaussian(d: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(SEED);
    let normal = Normal::new(0.0f32, 1.0).expect("valid normal");
    (0..d).map(|_| normal.sample(&mut rng)).collect()
}

/// The cargo target directory, found as criterion finds it (`CARGO_TARGET_DIR`), else the
/// target directory above this executable (the one cargo marked with `CACHEDIR.TAG`), else
/// the workspace's `target/`.
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        if dir.is_absolute() {
            return dir;
        }
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.ancestors().find(|a| a.join("CACHEDIR.TAG").is_file()) {
            return dir.to_path_buf();
        }
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// Writes `x` as raw little-endian `f32` to `<target>/bench-data/normal-<d>.f32`
/// (through a temporary file, so a reader never sees half of it).
fn dump(x: &[f32]) {
    let dir = target_dir().join("bench-data");
    let path = dir.join(format!("normal-{}.f32", x.len()));
    let tmp = dir.join(format!("normal-{}.f32.tmp", x.len()));
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&tmp, &bytes))
        .and_then(|()| std::fs::rename(&tmp, &path));
    match written {
        Ok(()) => eprintln!("input of d = {} written to {}", x.len(), path.display()),
        Err(e) => eprintln!("warning: could not write {}: {e}", path.display()),
    }
}

/// Whether the operator's messages decode (a placeholder operator's do not): checked on a
/// small vector, so that a skipped operator costs nothing at full size.
fn decodes(make: Make) -> Result<(), String> {
    let x = gaussian(1024);
    let mut msg = Vec::new();
    make().compress(&x, &mut StdRng::seed_from_u64(SEED + 1), &mut msg);
    validate(&msg, x.len())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn throughput(c: &mut Criterion) {
    let usable: Vec<(&str, Make)> = OPERATORS
        .iter()
        .copied()
        .filter(|&(name, make)| match decodes(make) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("skipping {name}: its messages do not decode ({e})");
                false
            }
        })
        .collect();

    for d in DIMS {
        let x = gaussian(d);
        if d == DUMP_DIM {
            dump(&x);
        }
        let mut group = c.benchmark_group(format!("d={d}"));
        group.throughput(Throughput::Bytes(4 * d as u64));
        if d >= 10_000_000 {
            // 100 MB per call, up to a few hundred ms for the slowest operators: few,
            // equal-sized samples keep the full run to a few minutes.
            group
                .sampling_mode(SamplingMode::Flat)
                .sample_size(10)
                .warm_up_time(Duration::from_secs(1))
                .measurement_time(Duration::from_secs(3));
        } else {
            group
                .sample_size(20)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(2));
        }

        // Criterion calls each closure many times (warm-up, then every sample): the state
        // is made on the first call only, so that no sample pays for a fresh allocation's
        // page faults or for making the message again, and only for selected benchmarks.
        let mut dst: Vec<f32> = Vec::new();
        group.bench_function(BenchmarkId::new("memcpy", "memcpy"), |b| {
            dst.resize(d, 0.0);
            b.iter(|| black_box(&mut dst[..]).copy_from_slice(black_box(&x)));
        });
        drop(dst);

        for &(name, make) in &usable {
            let mut state: Option<(Box<dyn Compressor>, StdRng, Vec<u8>)> = None;
            group.bench_function(BenchmarkId::new("compress", name), |b| {
                let (op, rng, out) = state.get_or_insert_with(|| {
                    let op = make();
                    let out = Vec::with_capacity(op.max_encoded_len(d));
                    (op, StdRng::seed_from_u64(SEED + 1), out)
                });
                b.iter(|| {
                    out.clear();
                    black_box(op.compress(black_box(&x), rng, out))
                });
            });
            drop(state);

            let mut state: Option<(Vec<u8>, Vec<f32>)> = None;
            group.bench_function(BenchmarkId::new("decode_add", name), |b| {
                let (msg, acc) = state.get_or_insert_with(|| {
                    let mut msg = Vec::new();
                    make().compress(&x, &mut StdRng::seed_from_u64(SEED + 1), &mut msg);
                    let mut acc = vec![0f32; d];
                    decode_add(&msg, SCALE, &mut acc)
                        .unwrap_or_else(|e| panic!("{name}: message of d = {d} refused: {e}"));
                    eprintln!(
                        "{name}: message of {} bytes ({:.2}% of 4d)",
                        msg.len(),
                        100.0 * msg.len() as f64 / (4 * d) as f64
                    );
                    (msg, acc)
                });
                b.iter(|| decode_add(black_box(&msg[..]), SCALE, black_box(&mut acc[..])))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, throughput);
criterion_main!(benches);
