//! Every fixture bundle end to end on the HTP emulator: each context against its golden,
//! then observation -> actions against the independent reference (and KeyStone's choice).

mod common;

use vla_policy::{Bundle, Policy};

fn gate(name: &str) {
    let Some(backend) = common::backend() else {
        return;
    };
    let bundle = Bundle::open(common::fixture(name)).unwrap();
    let mut policy = Policy::load(&bundle, &backend).unwrap();
    let report = bundle.parity(&mut policy).unwrap();
    assert!(report.passed(), "{name}: {:?}", report.failure_summary());
    let e = &report.end_to_end;
    eprintln!(
        "{name}: end-to-end actions cosine {:.8}, max abs {:.3e}, keystone {:?}",
        e.comparison.cosine, e.comparison.max_abs_diff, e.keystone
    );
    assert!(e.comparison.cosine >= 0.999);
    if name.contains("keystone") {
        let (want, got) = e.keystone.expect("KeyStone bundle reports its choice");
        assert_eq!(want, got, "KeyStone picks the reference's candidate");
    }
}

#[test]
fn molmoact2_original() {
    gate("molmoact2-original");
}

#[test]
fn molmoact2_lp_vtp_sd() {
    gate("molmoact2-lp-vtp-sd");
}

#[test]
fn molmoact2_drift_keystone() {
    gate("molmoact2-drift-keystone");
}

#[test]
fn molmoact2_operator_fused() {
    gate("molmoact2-operator-fused");
}

#[test]
fn fastwam() {
    gate("fastwam");
}
