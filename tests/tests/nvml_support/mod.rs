//! What the `sim_nvml_*` tests share: `nvml-wrapper` opened on a simulated node.

use nvml_wrapper::Nvml;
use tessera_e2e::{SimNode, sim_nvml_library};

/// Points this process at `node` (`TESSERA_SIM_STATE`) and initialises
/// `nvml-wrapper` against the simulated `libnvidia-ml.so.1`.
///
/// # Safety
///
/// Changes this process's environment: sound only while no other thread
/// reads or writes it, so only in a test binary that holds one test (the
/// harness's main thread only waits).
pub unsafe fn nvml_on(node: &SimNode) -> Nvml {
    // SAFETY: the caller's promise: no other thread touches the environment.
    unsafe { std::env::set_var("TESSERA_SIM_STATE", &node.state) };
    let lib = sim_nvml_library();
    Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("nvml-wrapper initialises against the simulated NVML")
}
