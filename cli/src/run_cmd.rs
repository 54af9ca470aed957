//! `tessera run`: a command under the shim with a fresh allocation; exits with its code.

use tessera_client::run::{RunArgs, run};

pub fn main(args: RunArgs) -> anyhow::Result<()> {
    let code = run(&args)?;
    std::process::exit(code);
}
