use super::*;
use crate::train::model::ImageInput;
use std::io::Write;
use std::sync::OnceLock;

fn embedded() -> &'static Mnist {
    static M: OnceLock<Mnist> = OnceLock::new();
    M.get_or_init(|| Mnist::embedded().expect("embedded MNIST parses"))
}

fn hist(labels: &[u8]) -> [usize; 10] {
    let mut h = [0; 10];
    for &l in labels {
        h[usize::from(l)] += 1;
    }
    h
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// 2 images of 2×3 pixels: 0..=5 and 250..=255.
fn tiny_images() -> Vec<u8> {
    let mut v = vec![0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3];
    v.extend([0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255]);
    v
}

fn tiny_labels() -> Vec<u8> {
    vec![0, 0, 8, 1, 0, 0, 0, 2, 7, 3]
}

#[test]
fn embedded_loads() {
    let m = embedded();
    assert_eq!(m.train.len(), 8000);
    assert_eq!(m.test.len(), 2000);
    for d in [&m.train, &m.test] {
        assert_eq!((d.rows, d.cols, d.features()), (28, 28, 784));
        assert_eq!(d.values().len(), d.len() * 784);
        assert!(
            hist(&d.labels).iter().all(|&c| c > 0),
            "all 10 labels present"
        );
        assert!(d.values().iter().all(|&v| (0.0..=1.0).contains(&v)));
        assert!(d.values().contains(&1.0) && d.values().contains(&0.0));
    }
    // Histograms documented in experiments/data/README.md.
    assert_eq!(
        hist(&m.train.labels),
        [808, 911, 812, 828, 762, 692, 813, 865, 734, 775]
    );
    assert_eq!(
        hist(&m.test.labels),
        [193, 216, 179, 204, 218, 171, 201, 205, 210, 203]
    );
    // Mean pixel of real MNIST is about 0.13.
    let mean =
        m.train.values().iter().map(|&v| f64::from(v)).sum::<f64>() / m.train.values().len() as f64;
    assert!((0.10..0.16).contains(&mean), "mean pixel {mean}");
}

#[test]
fn tiny_round_trip_plain_and_gz() {
    for (imgs, labs) in [
        (tiny_images(), tiny_labels()),
        (gz(&tiny_images()), gz(&tiny_labels())),
    ] {
        let (px, n, r, c) = parse_idx_images("tiny", &imgs).unwrap();
        assert_eq!((n, r, c), (2, 2, 3));
        assert_eq!(px.len(), 12);
        assert_eq!(px[0], 0.0);
        assert_eq!(px[5], 5.0 / 255.0);
        assert_eq!(px[11], 1.0);
        assert_eq!(parse_idx_labels("tiny", &labs).unwrap(), vec![7, 3]);
        let d = Dataset::from_idx("i", &imgs, "l", &labs).unwrap();
        assert_eq!((d.len(), d.features()), (2, 6));
        assert_eq!(d.image(1)[0], 250.0 / 255.0);
        let s = d.subset(&[1, 1, 0]);
        assert_eq!(s.labels, vec![3, 3, 7]);
        assert_eq!(s.image(2), d.image(0));
    }
}

#[test]
fn truncated_files() {
    let imgs = tiny_images();
    let e = parse_idx_images("imgs", &imgs[..imgs.len() - 1]).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::Truncated {
                expected: 28,
                found: 27,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("imgs") && e.to_string().contains("truncated"),
        "{e}"
    );
    // Header cut short.
    let e = parse_idx_images("imgs", &imgs[..10]).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::Truncated {
                expected: 16,
                found: 10,
                ..
            }
        ),
        "{e}"
    );
    let e = parse_idx_labels("labs", &tiny_labels()[..2]).unwrap_err();
    assert!(matches!(e, DataError::Truncated { .. }), "{e}");
    let e = parse_idx_labels("labs", &tiny_labels()[..9]).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::Truncated {
                expected: 10,
                found: 9,
                ..
            }
        ),
        "{e}"
    );
    // Truncated gzip stream.
    let z = gz(&imgs);
    let e = parse_idx_images("imgs.gz", &z[..z.len() - 10]).unwrap_err();
    assert!(matches!(e, DataError::Gzip { .. }), "{e}");
    // Trailing data.
    let mut long = tiny_labels();
    long.push(1);
    let e = parse_idx_labels("labs", &long).unwrap_err();
    assert!(matches!(e, DataError::TrailingBytes { .. }), "{e}");
    assert!(parse_idx_images("empty", &[]).is_err());
}

#[test]
fn bad_magic_and_labels() {
    // Label file given as images and vice versa.
    let e = parse_idx_images("x", &tiny_labels()).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::BadMagic {
                expected: 0x803,
                found: 0x801,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("0x00000801"), "{e}");
    let e = parse_idx_labels("y", &tiny_images()).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::BadMagic {
                expected: 0x801,
                found: 0x803,
                ..
            }
        ),
        "{e}"
    );
    let e = parse_idx_labels("z", b"hello world").unwrap_err();
    assert!(matches!(e, DataError::BadMagic { .. }), "{e}");
    let mut labs = tiny_labels();
    labs[9] = 10;
    let e = parse_idx_labels("labs", &labs).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::BadLabel {
                index: 1,
                label: 10,
                ..
            }
        ),
        "{e}"
    );
    // Absurd header dimensions: no huge allocation, no panic.
    let mut huge = tiny_images();
    huge[4..16].copy_from_slice(&[0xff; 12]);
    assert!(parse_idx_images("huge", &huge).is_err());
}

#[test]
fn count_mismatch() {
    let labs = vec![0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3];
    let e = Dataset::from_idx("imgs", &tiny_images(), "labs", &labs).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::CountMismatch {
                n_images: 2,
                n_labels: 3,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("imgs") && msg.contains("labs"), "{msg}");
}

#[test]
fn load_dir_variants_and_missing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::write(p.join("train-images-idx3-ubyte"), tiny_images()).unwrap();
    std::fs::write(p.join("train-labels-idx1-ubyte.gz"), gz(&tiny_labels())).unwrap();
    std::fs::write(p.join("t10k-images.idx3-ubyte"), tiny_images()).unwrap();
    let e = Mnist::load_dir(p).unwrap_err();
    assert!(
        matches!(&e, DataError::Missing { file, .. } if file == "t10k-labels-idx1-ubyte"),
        "{e}"
    );
    assert!(e.to_string().contains(&p.display().to_string()), "{e}");
    std::fs::write(p.join("t10k-labels.idx1-ubyte.gz"), gz(&tiny_labels())).unwrap();
    let m = Mnist::load_dir(p).unwrap();
    assert_eq!(
        (m.train.len(), m.test.len(), m.test.rows, m.test.cols),
        (2, 2, 2, 3)
    );
    assert_eq!(m.train, m.test);
}

#[test]
fn partition_parse() {
    assert_eq!("iid".parse::<Partition>().unwrap(), Partition::Iid);
    assert_eq!(" IID ".parse::<Partition>().unwrap(), Partition::Iid);
    assert_eq!(
        "dirichlet".parse::<Partition>().unwrap(),
        Partition::Dirichlet { alpha: 0.5 }
    );
    assert_eq!(
        "dirichlet:0.1".parse::<Partition>().unwrap(),
        Partition::Dirichlet { alpha: 0.1 }
    );
    for bad in [
        "",
        "noniid",
        "dirichlet:",
        "dirichlet:x",
        "dirichlet:0",
        "dirichlet:-1",
        "dirichlet:inf",
        "iid:3",
    ] {
        let e = bad.parse::<Partition>().unwrap_err();
        assert!(e.to_string().contains("invalid partition"), "{bad}: {e}");
    }
    for p in [Partition::Iid, Partition::Dirichlet { alpha: 0.25 }] {
        assert_eq!(p.to_string().parse::<Partition>().unwrap(), p);
    }
}

fn check_cover(shards: &[Vec<usize>], n: usize) {
    let mut seen = vec![false; n];
    for s in shards {
        assert!(!s.is_empty());
        for &i in s {
            assert!(!seen[i], "index {i} twice");
            seen[i] = true;
        }
    }
    assert!(seen.iter().all(|&b| b), "not a cover");
}

#[test]
fn partition_iid() {
    let labels = &embedded().train.labels;
    for n_peers in [1, 3, 7, 16] {
        let s = partition(labels, n_peers, Partition::Iid, 1).unwrap();
        assert_eq!(s.len(), n_peers);
        check_cover(&s, labels.len());
        let (min, max) = (
            s.iter().map(Vec::len).min().unwrap(),
            s.iter().map(Vec::len).max().unwrap(),
        );
        assert!(max - min <= 1, "{min}..{max}");
    }
    let a = partition(labels, 5, Partition::Iid, 7).unwrap();
    assert_eq!(a, partition(labels, 5, Partition::Iid, 7).unwrap());
    assert_ne!(a, partition(labels, 5, Partition::Iid, 8).unwrap());
    assert!(partition(labels, 0, Partition::Iid, 0).is_err());
    assert!(partition(&[1, 2], 3, Partition::Iid, 0).is_err());
    assert_eq!(partition(&[1, 2], 2, Partition::Iid, 0).unwrap().len(), 2);
}

/// Mean over peers of the fraction of the shard held by its majority label.
fn majority_share(labels: &[u8], shards: &[Vec<usize>]) -> f64 {
    shards
        .iter()
        .map(|s| {
            let h = hist(&s.iter().map(|&i| labels[i]).collect::<Vec<_>>());
            *h.iter().max().unwrap() as f64 / s.len() as f64
        })
        .sum::<f64>()
        / shards.len() as f64
}

#[test]
fn partition_dirichlet() {
    let labels = &embedded().train.labels;
    let skewed = Partition::Dirichlet { alpha: 0.1 };
    // Majority share averaged over 4 seeds (IID gives about 0.11).
    let mut m = 0.0;
    for seed in 0..4 {
        let s = partition(labels, 10, skewed, seed).unwrap();
        check_cover(&s, labels.len());
        m += majority_share(labels, &s) / 4.0;
    }
    assert!(m > 0.5, "alpha 0.1 majority share {m}");
    let s = partition(labels, 10, skewed, 3).unwrap();
    assert_eq!(s, partition(labels, 10, skewed, 3).unwrap());
    assert_ne!(s, partition(labels, 10, skewed, 4).unwrap());

    let flat = partition(labels, 10, Partition::Dirichlet { alpha: 1000.0 }, 3).unwrap();
    check_cover(&flat, labels.len());
    let m = majority_share(labels, &flat);
    assert!(m < 0.15, "alpha 1000 majority share {m}");
    for sh in &flat {
        assert!(
            (700..=900).contains(&sh.len()),
            "alpha 1000 shard size {}",
            sh.len()
        );
    }

    // Many peers, tiny alpha: the repair step still gives everyone a sample.
    let many = partition(labels, 2000, Partition::Dirichlet { alpha: 0.01 }, 0).unwrap();
    assert_eq!(many.len(), 2000);
    check_cover(&many, labels.len());
    // Exactly as many peers as samples.
    let tight = partition(&labels[..50], 50, Partition::Dirichlet { alpha: 0.1 }, 0).unwrap();
    check_cover(&tight, 50);

    assert!(partition(labels, 4, Partition::Dirichlet { alpha: 0.0 }, 0).is_err());
    assert!(partition(labels, 4, Partition::Dirichlet { alpha: f64::NAN }, 0).is_err());
    assert_eq!(
        partition(labels, 1, skewed, 0).unwrap()[0].len(),
        labels.len()
    );
}

#[test]
fn synthetic_data_have_the_model_shapes_and_ranges() {
    let images = ModelKind::RESNET20.input();
    let a = Dataset::synthetic(images, 20, 7);
    assert_eq!(
        (a.len(), a.features(), a.channels, a.rows, a.cols),
        (20, 3072, 3, 32, 32)
    );
    assert!(a.values().iter().all(|v| (0.0..1.0).contains(v)));
    assert!(a.labels.iter().all(|&l| l < 10));
    assert!(hist(&a.labels).iter().filter(|&&c| c > 0).count() > 5);
    assert_eq!(
        a,
        Dataset::synthetic(images, 20, 7),
        "the seed fixes the data"
    );
    assert_ne!(a, Dataset::synthetic(images, 20, 8));

    let tokens = ModelKind::transformer().input();
    let t = Dataset::synthetic(tokens, 10, 7);
    assert_eq!((t.len(), t.features()), (10, 65));
    assert!(t
        .values()
        .iter()
        .all(|&v| v.fract() == 0.0 && (0.0..256.0).contains(&v)));
    assert!(
        t.values().iter().any(|&v| v > 200.0),
        "the whole vocabulary"
    );
    assert!(t.labels.iter().all(|&l| l == 0));
}

#[test]
fn run_data_is_mnist_or_synthetic_by_model() {
    let mnist = RunData::load(ModelKind::CNN, None, 1).unwrap();
    assert_eq!((mnist.train.len(), mnist.test.features()), (8000, 784));
    let r = RunData::load(ModelKind::RESNET20, None, 1).unwrap();
    assert_eq!(
        (r.train.len(), r.test.len(), r.train.features()),
        (SYNTHETIC_TRAIN_LEN, SYNTHETIC_TEST_LEN, 3072)
    );
    assert_ne!(r.train.image(0), r.test.image(0));
    assert_eq!(r, RunData::load(ModelKind::RESNET20, None, 1).unwrap());
    // The language model: the embedded King James Bible, or a byte file.
    let t = RunData::load(ModelKind::transformer(), None, 1).unwrap();
    assert_eq!(t.test.features(), 65);
    assert_eq!(t.test.len(), text::VALIDATION_SEQUENCES);
    let err = RunData::load(
        ModelKind::transformer(),
        Some(Path::new("/data/no-such-text")),
        1,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("/data/no-such-text"), "{err}");
    let err = RunData::load(ModelKind::RESNET20, Some(Path::new("/data/mnist")), 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("resnet20") && err.contains("/data/mnist") && err.contains("not a folder"),
        "{err}"
    );
    // A folder of none of the image formats names them all.
    let empty = tempfile::tempdir().unwrap();
    let err = RunData::load(ModelKind::MLP, Some(empty.path()), 1)
        .unwrap_err()
        .to_string();
    for format in ["MNIST", "CIFAR-10", "image folder"] {
        assert!(err.contains(format), "{err}");
    }
    // An MLP told to take other images than MNIST's needs them from --data.
    let err = RunData::load("mlp:input=3x32x32".parse().unwrap(), None, 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("1×28×28 images, which are not resized"),
        "{err}"
    );
}

/// One CIFAR-10 record: `label`, then the red, green and blue planes, pixel (c, r, col) of
/// value `(seed + 7c + 3r + col) mod 256`.
fn cifar_record(label: u8, seed: usize) -> Vec<u8> {
    let mut v = vec![label];
    for c in 0..3 {
        for r in 0..32 {
            v.extend((0..32).map(|col| ((seed + 7 * c + 3 * r + col) % 256) as u8));
        }
    }
    v
}

/// A CIFAR-10 folder: each training file holds `per_file` records, the test file 3.
fn cifar_dir(per_file: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join(cifar::FOLDER);
    std::fs::create_dir(&folder).unwrap();
    for (f, name) in cifar::TRAIN_FILES.iter().enumerate() {
        let bytes: Vec<u8> = (0..per_file)
            .flat_map(|i| cifar_record(((f + i) % 10) as u8, 10 * f + i))
            .collect();
        std::fs::write(folder.join(name), bytes).unwrap();
    }
    let test: Vec<u8> = (0..3)
        .flat_map(|i| cifar_record(9 - i as u8, 100 + i))
        .collect();
    std::fs::write(folder.join(cifar::TEST_FILE), test).unwrap();
    dir
}

#[test]
fn cifar10_binary_files_are_read_normalised_in_record_order() {
    let dir = cifar_dir(2);
    // `--data` may name the extracted folder or the folder that holds it.
    for data in [dir.path().to_owned(), dir.path().join(cifar::FOLDER)] {
        let run = RunData::load(ModelKind::RESNET20, Some(&data), 1).unwrap();
        assert_eq!((run.train.len(), run.test.len()), (10, 3));
        assert_eq!(
            (run.train.channels, run.train.rows, run.train.cols),
            (3, 32, 32)
        );
        // data_batch_1 first, then _2 …: file f's record i has label (f + i) mod 10.
        assert_eq!(run.train.labels, [0, 1, 1, 2, 2, 3, 3, 4, 4, 5]);
        assert_eq!(run.test.labels, [9, 8, 7]);
        assert_eq!(run.train.augment, Some(cifar::CropFlip::cifar10()));
        assert_eq!(run.test.augment, None, "test images are not augmented");
        // Record 3 is data_batch_2's second (seed 11); pixel (c, r, col) normalised.
        let image = run.train.image(3);
        for (c, r, col) in [(0, 0, 0), (1, 5, 31), (2, 31, 7)] {
            let byte = ((11 + 7 * c + 3 * r + col) % 256) as f32;
            let want = (byte / 255.0 - cifar::MEAN[c]) / cifar::STD[c];
            assert_eq!(
                image[c * 1024 + r * 32 + col],
                want,
                "pixel ({c}, {r}, {col})"
            );
        }
    }
    // The shard keeps the augmentation.
    let run = RunData::load(ModelKind::RESNET20, Some(dir.path()), 1).unwrap();
    assert_eq!(run.train.subset(&[1, 2]).augment, run.train.augment);
    // The training set is held as its bytes (a shard too), normalised when a sample is
    // taken; the test set, evaluated whole every epoch, as f32.
    assert_eq!(run.train.value_bytes(), 10 * 3072);
    assert_eq!(run.test.value_bytes(), 4 * 3 * 3072);
    let shard = run.train.subset(&[3, 0]);
    assert!(matches!(shard.values, Values::Bytes { .. }));
    assert_eq!(shard.image(0), run.train.image(3));
    assert_eq!(shard.values()[..3072], *run.train.image(3));
}

#[test]
fn bad_cifar10_files_get_one_clear_error_each() {
    let parse = |bytes: &[u8]| cifar::parse("f.bin", bytes).unwrap_err().to_string();
    let mut two = cifar_record(1, 0);
    two.extend(cifar_record(2, 1));
    let err = parse(&two[..two.len() - 100]);
    assert!(
        err.contains("f.bin") && err.contains("record 1 is truncated"),
        "{err}"
    );
    let err = parse(&cifar_record(10, 0));
    assert!(err.contains("record 0 has label 10"), "{err}");
    assert!(parse(&[]).contains("empty"));
    // A missing file is named, with the folder.
    let dir = cifar_dir(1);
    let folder = dir.path().join(cifar::FOLDER);
    std::fs::remove_file(folder.join("data_batch_4.bin")).unwrap();
    let err = RunData::load(ModelKind::RESNET20, Some(dir.path()), 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("data_batch_4.bin not found") && err.contains(cifar::FOLDER),
        "{err}"
    );
    // CIFAR-10 for a model told to take other images: not resized, refused.
    let whole = cifar_dir(1);
    let err = RunData::load("mlp:input=1x32x32".parse().unwrap(), Some(whole.path()), 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mlp:input=1x32x32") && err.contains("holds 3×32×32 images"),
        "{err}"
    );
}

#[test]
fn every_image_model_reads_cifar10_and_is_sized_for_it() {
    let dir = cifar_dir(1);
    for kind in [ModelKind::MLP, ModelKind::CNN, ModelKind::RESNET20] {
        let run = RunData::load(kind, Some(dir.path()), 1).unwrap();
        assert_eq!(run.train.features(), 3072);
        let fitted = kind.fitted(&run.train);
        assert_eq!(fitted.images(), Some(ImageInput::CIFAR10), "{kind}");
        assert_eq!(fitted.input().features(), run.train.features());
    }
    assert_eq!(
        ModelKind::CNN
            .fitted(
                &RunData::load(ModelKind::CNN, Some(dir.path()), 1)
                    .unwrap()
                    .train
            )
            .to_string(),
        "cnn:input=3x32x32"
    );
    // ResNet-20 on MNIST: one channel of 28×28.
    let mnist = Mnist::embedded().unwrap();
    assert_eq!(
        ModelKind::RESNET20.fitted(&mnist.train).to_string(),
        "resnet20:input=1x28x28"
    );
}

/// Writes `img` as `dir/<split>/<class>/<name>`, creating the folders.
fn put(dir: &Path, split: &str, class: &str, name: &str, img: &image::DynamicImage) {
    let folder = dir.join(split).join(class);
    std::fs::create_dir_all(&folder).unwrap();
    img.save(folder.join(name)).unwrap();
}

/// An RGB image of height `h`, width `w`, pixel (r, c) = (r + k, c + k, 100 + k).
fn rgb(h: u32, w: u32, k: u8) -> image::DynamicImage {
    image::DynamicImage::ImageRgb8(image::RgbImage::from_fn(w, h, |c, r| {
        image::Rgb([r as u8 + k, c as u8 + k, 100 + k])
    }))
}

#[test]
fn an_image_folder_is_read_by_class_in_the_first_image_s_size() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    put(d, "train", "dog", "b.png", &rgb(5, 6, 2));
    put(d, "train", "dog", "a.jpg", &rgb(5, 6, 1));
    put(d, "train", "cat", "x.png", &rgb(5, 6, 0));
    put(d, "test", "dog", "t.png", &rgb(5, 6, 3));
    std::fs::write(d.join("train/cat/notes.txt"), "not an image").unwrap();
    let run = RunData::load(ModelKind::CNN, Some(d), 1).unwrap();
    // Classes in name order (cat 0, dog 1), files in name order; the text file skipped.
    assert_eq!(run.train.labels, [0, 1, 1]);
    assert_eq!(run.test.labels, [1]);
    assert_eq!(
        (
            run.train.channels,
            run.train.rows,
            run.train.cols,
            run.train.classes
        ),
        (3, 5, 6, 2)
    );
    // Pixels / 255, channel-major: red of (2, 4) in cat/x.png is 2, green 4, blue 100.
    let x = run.train.image(0);
    assert_eq!(x[2 * 6 + 4], 2.0 / 255.0);
    assert_eq!(x[30 + 2 * 6 + 4], 4.0 / 255.0);
    assert_eq!(x[60 + 2 * 6 + 4], 100.0 / 255.0);
    // The JPEG decodes to about its pixels (lossy).
    let a = run.train.image(1);
    assert!((a[60] - 101.0 / 255.0).abs() < 0.05, "{}", a[60]);
    let fitted = ModelKind::CNN.fitted(&run.train);
    assert_eq!(fitted.to_string(), "cnn:input=3x5x6,classes=2");
    // Told a size, every image is converted and resized to it.
    let grey: ModelKind = "cnn:input=1x8x8".parse().unwrap();
    let run = RunData::load(grey, Some(d), 1).unwrap();
    assert_eq!((run.train.features(), run.train.classes), (64, 2));
    // A grey first image makes a grey data set.
    let g = tempfile::tempdir().unwrap();
    let luma =
        image::DynamicImage::ImageLuma8(image::GrayImage::from_pixel(4, 4, image::Luma([51])));
    put(g.path(), "train", "a", "1.png", &luma);
    put(g.path(), "train", "b", "2.png", &rgb(4, 4, 0));
    put(g.path(), "val", "b", "3.png", &luma);
    let run = RunData::load(ModelKind::MLP, Some(g.path()), 1).unwrap();
    assert_eq!(run.train.channels, 1);
    assert_eq!(*run.test.image(0), [0.2; 16]);
}

#[test]
fn bad_image_folders_get_one_clear_error_each() {
    let err_of = |build: &dyn Fn(&Path)| {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        RunData::load(ModelKind::CNN, Some(dir.path()), 1)
            .unwrap_err()
            .to_string()
    };
    let two_classes = |d: &Path| {
        put(d, "train", "a", "1.png", &rgb(5, 5, 0));
        put(d, "train", "b", "1.png", &rgb(5, 5, 1));
    };
    let err = err_of(&|d| two_classes(d));
    assert!(err.contains("needs a test/ (or val/) folder"), "{err}");
    let err = err_of(&|d| {
        two_classes(d);
        put(d, "test", "c", "1.png", &rgb(5, 5, 0));
    });
    assert!(
        err.contains("class \"c\" is not among the training classes (a, b)"),
        "{err}"
    );
    let err = err_of(&|d| {
        put(d, "train", "a", "1.png", &rgb(5, 5, 0));
        put(d, "test", "a", "1.png", &rgb(5, 5, 0));
    });
    assert!(
        err.contains("1 class folders; an image folder needs 2 to 256"),
        "{err}"
    );
    let err = err_of(&|d| {
        two_classes(d);
        put(d, "train", "b", "2.png", &rgb(7, 5, 0));
        put(d, "test", "a", "1.png", &rgb(5, 5, 0));
    });
    assert!(
        err.contains("2.png")
            && err.contains("7×5 pixels, but the first training image is 5×5")
            && err.contains("input=3x5x5"),
        "{err}"
    );
    let err = err_of(&|d| {
        two_classes(d);
        std::fs::write(d.join("train/b/broken.png"), b"not a png").unwrap();
        put(d, "test", "a", "1.png", &rgb(5, 5, 0));
    });
    assert!(
        err.contains("broken.png") && err.contains("not a readable PNG or JPEG"),
        "{err}"
    );
    let err = err_of(&|d| {
        two_classes(d);
        std::fs::create_dir_all(d.join("train/c")).unwrap();
        put(d, "test", "a", "1.png", &rgb(5, 5, 0));
    });
    assert!(
        err.contains("train/c") && err.contains("holds no .png"),
        "{err}"
    );
}

#[test]
fn crop_flip_shifts_and_mirrors_whole_images_and_pads_with_the_fill() {
    let (rows, cols, pad) = (6, 5, 2);
    let aug = cifar::CropFlip {
        padding: pad,
        fill: vec![-1.0, -2.0],
    };
    // Pixel (c, r, col) holds 100c + 10r + col: every value tells where it came from.
    let image: Vec<f32> = (0..2)
        .flat_map(|c| {
            (0..rows).flat_map(move |r| (0..cols).map(move |col| (100 * c + 10 * r + col) as f32))
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..400 {
        let mut out = Vec::new();
        aug.apply(&image, (rows, cols), &mut rng, &mut out);
        assert_eq!(out.len(), image.len());
        // Exactly one (dy, dx, flip) explains every output pixel.
        let fits: Vec<_> = (-2..=2isize)
            .flat_map(|dy| (-2..=2isize).flat_map(move |dx| [(dy, dx, false), (dy, dx, true)]))
            .filter(|&(dy, dx, flip)| {
                (0..2).all(|c| {
                    (0..rows).all(|r| {
                        (0..cols).all(|col| {
                            let sc = if flip { cols - 1 - col } else { col } as isize + dx;
                            let sr = r as isize + dy;
                            let want = if (0..rows as isize).contains(&sr)
                                && (0..cols as isize).contains(&sc)
                            {
                                image[c * rows * cols + sr as usize * cols + sc as usize]
                            } else {
                                aug.fill[c]
                            };
                            out[c * rows * cols + r * cols + col] == want
                        })
                    })
                })
            })
            .collect();
        assert_eq!(fits.len(), 1, "{fits:?}");
        seen.insert(fits[0]);
    }
    // Every shift in ±padding, flipped and not, is drawn.
    assert_eq!(seen.len(), 5 * 5 * 2);
}

#[test]
fn a_folder_of_token_files_trains_on_train_and_validates_on_val_with_or_without_header() {
    let dir = tempfile::tempdir().unwrap();
    let raw = |ids: &[u16]| -> Vec<u8> { ids.iter().flat_map(|i| i.to_le_bytes()).collect() };
    // nanoGPT's prepare.py: header-less train.bin; llm.c's header on the validation file.
    let train: Vec<u16> = (0..100).map(|i| (i * 7 % 500) as u16).collect();
    let val: Vec<u16> = (0..40).map(|i| (600 + i) as u16).collect();
    std::fs::write(dir.path().join("train.bin"), raw(&train)).unwrap();
    std::fs::write(dir.path().join("val.bin"), tokens::write(&val)).unwrap();
    std::fs::write(dir.path().join("meta.pkl"), b"not read").unwrap();
    let model: ModelKind = "transformer:vocab=1000,context=8".parse().unwrap();
    let d = RunData::load(model, Some(dir.path()), 1).unwrap();
    // Rows of context + 1 ids, starting every `context` ids; validation from val.bin only.
    assert_eq!(d.train.features(), 9);
    assert_eq!(
        d.train.image(0),
        &train[..9].iter().map(|&i| f32::from(i)).collect::<Vec<_>>()[..]
    );
    assert_eq!(d.train.image(1)[0], f32::from(train[8]));
    assert!(d.test.values().iter().all(|&v| (600.0..640.0).contains(&v)));
    assert_eq!(d.train.bytes_per_token, None);
    // Shards in name order, concatenated.
    std::fs::rename(
        dir.path().join("train.bin"),
        dir.path().join("fineweb_train_000002.bin"),
    )
    .unwrap();
    std::fs::write(dir.path().join("fineweb_train_000001.bin"), raw(&[5; 10])).unwrap();
    let d = RunData::load(model, Some(dir.path()), 1).unwrap();
    assert_eq!(*d.train.image(0), [5.0; 9]);
    assert_eq!(d.train.image(1)[2], f32::from(train[0]));
    // Bad folders and files: one line each.
    let err = |d: &Path| RunData::load(model, Some(d), 1).unwrap_err().to_string();
    std::fs::write(dir.path().join("val.bin"), [1u8, 2, 3]).unwrap();
    let e = err(dir.path());
    assert!(e.contains("val.bin") && e.contains("even length"), "{e}");
    std::fs::remove_file(dir.path().join("val.bin")).unwrap();
    let e = err(dir.path());
    assert!(e.contains("0 validation files"), "{e}");
    std::fs::write(dir.path().join("val.bin"), raw(&[999, 1000])).unwrap();
    let e = err(dir.path());
    assert!(e.contains("beyond the model's vocabulary of 1000"), "{e}");
    std::fs::write(dir.path().join("val.bin"), raw(&[1, 2])).unwrap();
    let e = err(dir.path());
    assert!(
        e.contains("2 validation tokens") && e.contains("at least 9"),
        "{e}"
    );
    // One header-less .bin given alone is not read as a byte text.
    let e = err(&dir.path().join("fineweb_train_000001.bin"));
    assert!(
        e.contains("header-less") && e.contains("train.bin and val.bin"),
        "{e}"
    );
}

#[test]
fn gpt2_token_runs_know_the_bytes_per_predicted_token_of_their_validation_set() {
    let text = "In the beginning God created the heaven and the earth. ".repeat(60);
    let mut ids = vec![tokens::END_OF_TEXT];
    ids.extend(tokens::gpt2_encode(&text).unwrap());
    let file = tempfile::NamedTempFile::with_suffix(".bin").unwrap();
    std::fs::write(file.path(), tokens::write(&ids)).unwrap();
    let gpt2: ModelKind = "transformer:vocab=50257,context=16".parse().unwrap();
    let d = RunData::load(gpt2, Some(file.path()), 1).unwrap();
    // By hand: each predicted token's decoded text (ASCII here, so one byte a character).
    let (mut bytes, mut count) = (0usize, 0usize);
    for r in 0..d.test.len() {
        for &id in &d.test.image(r)[1..] {
            bytes += tokens::gpt2_decode(&[id as u32]).len();
            count += 1;
        }
    }
    let want = bytes as f64 / count as f64;
    assert_eq!(d.test.bytes_per_token, Some(want));
    assert!(want > 3.0 && want < 6.0, "{want}");
    // Another vocabulary: its tokens' bytes are not known.
    let other: ModelKind = "transformer:vocab=60000,context=16".parse().unwrap();
    assert_eq!(
        RunData::load(other, Some(file.path()), 1)
            .unwrap()
            .test
            .bytes_per_token,
        None
    );
}

#[test]
fn batches_of_a_shard_held_as_bytes_take_each_image_augmented() {
    // Padding 0: the crop is the image itself, so every row is its image or its mirror.
    let (n, c, h, w) = (5, 2, 3, 4);
    let shard = Dataset {
        values: Values::Bytes {
            bytes: (0..n * c * h * w).map(|i| (i * 7 % 256) as u8).collect(),
            mean: vec![0.1, 0.2],
            std: vec![0.5, 0.25],
        },
        labels: (0..n as u8).collect(),
        channels: c,
        rows: h,
        cols: w,
        classes: n,
        augment: Some(cifar::CropFlip {
            padding: 0,
            fill: vec![0.0; c],
        }),
        bytes_per_token: None,
    };
    let mirror = |image: &[f32]| -> Vec<f32> {
        image
            .chunks_exact(w)
            .flat_map(|row| row.iter().rev().copied())
            .collect()
    };
    let mut batches = Batches::new(n, 3);
    let (mut images, mut labels) = (Vec::new(), Vec::new());
    let mut flipped = 0;
    for _ in 0..8 {
        batches.next_batch(&shard, 3, &mut images, &mut labels);
        for (row, &label) in images.chunks_exact(c * h * w).zip(&labels) {
            let image = shard.image(label as usize);
            assert!(row == &*image || row == mirror(&image), "sample {label}");
            flipped += usize::from(row != &*image);
        }
    }
    assert!(flipped > 0 && flipped < 24, "flips drawn: {flipped} of 24");
}
