//! `--device` on this machine: in a build without the `cuda` feature, `auto` runs on the
//! CPU and says nothing; with the feature but no usable GPU it says why in one line; in
//! both, `cuda` is an error giving the reason. On a machine with a GPU and the feature,
//! `auto` puts the CUDA device first.

use flm_devices::{select, CpuDevice, DeviceChoice};

#[test]
fn auto_and_cuda_follow_what_this_machine_has() {
    let auto = select(DeviceChoice::Auto, CpuDevice::new().unwrap()).unwrap();
    let names: Vec<_> = auto.devices.iter().map(|d| d.name()).collect();
    if names == ["cuda", "cpu"] {
        eprintln!("a CUDA GPU is present: the fallback path is not exercised here");
        assert!(auto.notice.is_none());
        assert!(select(DeviceChoice::Cuda, CpuDevice::new().unwrap()).is_ok());
        return;
    }
    assert_eq!(names, ["cpu"]);
    let err = select(DeviceChoice::Cuda, CpuDevice::new().unwrap())
        .err()
        .expect("--device cuda without a GPU fails");
    if !cfg!(feature = "cuda") {
        assert!(auto.notice.is_none(), "{:?}", auto.notice);
        assert!(
            err.to_string().contains("built without the `cuda` feature"),
            "{err}"
        );
        return;
    }
    let notice = auto
        .notice
        .expect("a fallback from a possible GPU says why");
    assert!(
        notice.starts_with("flm: no CUDA GPU (") && notice.ends_with("); using the CPU"),
        "{notice}"
    );
    assert!(!notice.contains('\n'));
    let why = &notice["flm: no CUDA GPU (".len()..notice.len() - "); using the CPU".len()];
    assert!(err.to_string().contains(why), "{err} / {why}");
}
