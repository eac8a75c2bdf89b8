//! `coli run` and `coli score`: the generation commands. Their arguments are declared in
//! [`crate::args`]; the work happens in-process ([`crate::local`], with `--local`) or in the
//! daemon ([`crate::remote`]).

use crate::args::{Global, RunArgs, ScoreArgs};
use crate::{daemon_discovery, local, remote};

pub fn run(global: &Global, args: RunArgs) -> anyhow::Result<()> {
    if args.target.local {
        return local::run(&args);
    }
    let rt = daemon_discovery::runtime()?;
    rt.block_on(async {
        let mut client = daemon_discovery::ensure(global).await?;
        remote::run(&mut client, &args).await
    })
}

pub fn score(global: &Global, args: ScoreArgs) -> anyhow::Result<()> {
    if args.target.local {
        return local::score(&args);
    }
    let rt = daemon_discovery::runtime()?;
    rt.block_on(async {
        let mut client = daemon_discovery::ensure(global).await?;
        remote::score(&mut client, &args).await
    })
}
