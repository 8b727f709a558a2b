//! Default names: each device started without a name of its own is `loopback<N>` with the
//! lowest `N` no live device of the process holds, so two at once are told apart in messages
//! (and one at a time is always `loopback0`); a name given is kept as given. One test in its
//! own binary: no other test's devices take numbers meanwhile.

use userdma::device::Device;
use userdma_loopback::{Config, Loopback};

fn name(device: &Loopback) -> &str {
    &device.identity().name
}

#[test]
fn devices_without_a_name_of_their_own_are_numbered_while_they_live() {
    let first = Loopback::new(Config::default()).unwrap();
    let second = Loopback::new(Config::default()).unwrap();
    assert_eq!(name(&first), "loopback0");
    assert_eq!(name(&second), "loopback1");
    // A name given is kept, and takes no number.
    let named = Loopback::new(Config::default().name("npu-a")).unwrap();
    assert_eq!(name(&named), "npu-a");
    drop(first);
    // The lowest free number again; the config a device reports starts another one numbered.
    let third = Loopback::new(second.config().clone()).unwrap();
    assert_eq!(name(&third), "loopback0");
    drop((second, third, named));
    assert_eq!(
        name(&Loopback::new(Config::default()).unwrap()),
        "loopback0"
    );
}
