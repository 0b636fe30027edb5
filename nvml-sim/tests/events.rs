//! XID and ECC events through nvml-wrapper's event API: delivery of a line appended while
//! another thread waits, filtering by registration, timeouts, and the event data layout.
#![allow(clippy::unwrap_used)] // a failed unwrap fails the test at its line

mod common;

use std::thread;
use std::time::{Duration, Instant};

use mesos_gpu_testkit::nvml_sim::SimNode;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

#[test]
fn xid_appended_while_waiting_is_delivered() {
    let sim = SimNode::shipped("dgx1-v100");
    let nvml = common::open(&sim);
    let gpu3 = nvml.device_by_index(3).unwrap();
    assert!(
        gpu3.supported_event_types()
            .unwrap()
            .contains(EventTypes::CRITICAL_XID_ERROR)
    );
    let set = gpu3
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .unwrap();

    let started = Instant::now();
    let event = thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(100));
            sim.append_event("xid 3 79");
        });
        set.wait(10_000)
            .expect("the XID arrives before the timeout")
    });
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "waited for the writer"
    );
    assert_eq!(event.device.index().unwrap(), 3);
    assert_eq!(event.device.uuid().unwrap(), gpu3.uuid().unwrap());
    assert_eq!(event.event_type, EventTypes::CRITICAL_XID_ERROR);
    assert!(matches!(event.event_data, Some(XidError::Value(79))));
}

#[test]
fn only_registered_gpus_and_types_after_registration_are_delivered() {
    let sim = SimNode::shipped("dgx1-v100");
    let nvml = common::open(&sim);
    sim.append_event("xid 3 48");
    let gpu3 = nvml.device_by_index(3).unwrap();
    let set = gpu3
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .unwrap();

    sim.append_event("xid 2 31");
    sim.append_event("ecc-dbe 3");
    sim.append_event("# a comment");
    sim.append_event("xid 3 13");
    let first = set.wait(1_000).unwrap();
    assert_eq!(first.device.index().unwrap(), 3);
    assert!(
        matches!(first.event_data, Some(XidError::Value(13))),
        "the line before registration, GPU 2's XID and the unregistered ECC type are skipped: {first:?}"
    );
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
}

#[test]
fn wait_times_out() {
    let sim = SimNode::shipped("pcie-t4x4");
    let nvml = common::open(&sim);
    let gpu = nvml.device_by_index(0).unwrap();
    let set = gpu
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .unwrap();
    let started = Instant::now();
    assert!(matches!(set.wait(200), Err(NvmlError::Timeout)));
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(matches!(set.wait(0), Err(NvmlError::Timeout)));
}

#[test]
fn ecc_and_lost_events_and_several_sets() {
    let sim = SimNode::shipped("dgx-a100");
    let nvml = common::open(&sim);
    let gpu5 = nvml.device_by_index(5).unwrap();
    let gpu6 = nvml.device_by_index(6).unwrap();
    let all = EventTypes::CRITICAL_XID_ERROR
        | EventTypes::DOUBLE_BIT_ECC_ERROR
        | EventTypes::SINGLE_BIT_ECC_ERROR;
    let set = gpu5
        .register_events(all, nvml.create_event_set().unwrap())
        .unwrap();
    let set = gpu6
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    let other = gpu6
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .unwrap();

    sim.append_event("ecc-sbe 5");
    sim.append_event("ecc-dbe 6");
    sim.append_event("lost 6");
    let sbe = set.wait(1_000).unwrap();
    assert_eq!(
        (sbe.device.index().unwrap(), sbe.event_type),
        (5, EventTypes::SINGLE_BIT_ECC_ERROR)
    );
    assert!(sbe.event_data.is_none());
    let lost = set.wait(1_000).unwrap();
    assert_eq!(lost.event_type, EventTypes::CRITICAL_XID_ERROR);
    assert!(
        matches!(lost.event_data, Some(XidError::Value(79))),
        "a lost GPU reports XID 79"
    );
    assert!(
        matches!(lost.device.index(), Err(NvmlError::GpuLost)),
        "and is lost from then on"
    );
    assert!(
        matches!(
            other.wait(1_000).unwrap().event_data,
            Some(XidError::Value(79))
        ),
        "every registered set gets it"
    );
    assert!(matches!(set.wait(20), Err(NvmlError::Timeout)));
    assert!(
        matches!(gpu6.register_events(EventTypes::CRITICAL_XID_ERROR, nvml.create_event_set().unwrap()), Err(e) if matches!(e.error, NvmlError::GpuLost))
    );
}
