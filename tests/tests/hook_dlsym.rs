//! The shim's `dlsym` in a real process: lookups it does not govern are
//! answered exactly as without it, including `RTLD_NEXT` from another
//! interposer loaded after it (which must find the next definition after
//! *itself*, not after the shim).

mod hook_support;

use std::process::Command;

use hook_support::*;

const INTERPOSER: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>
static int depth;
/* Wraps getpid the usual way: RTLD_NEXT must find libc's, not this one. */
pid_t getpid(void) {
    static pid_t (*next)(void);
    if (!next) next = (pid_t (*)(void))dlsym(RTLD_NEXT, "getpid");
    if (++depth > 3) _exit(42); /* found itself: endless recursion */
    pid_t p = next();
    depth--;
    return p;
}
"#;

const MAIN: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(void) {
    long a = (long)getpid();
    long b = syscall(SYS_getpid);
    dlerror();
    void *p = dlsym(RTLD_DEFAULT, "no_such_symbol_anywhere");
    const char *e = dlerror();
    void *w = dlsym(RTLD_DEFAULT, "write");
    void *h = dlopen("libc.so.6", RTLD_NOW);
    void *w2 = dlsym(h, "write");
    printf("getpid %s\n", a == b ? "ok" : "wrong");
    printf("missing %s %s\n", p ? "found" : "null", e ? "error-set" : "no-error");
    printf("write %s\n", w && w == w2 ? "same" : "different");
    return 0;
}
"#;

#[test]
fn rtld_next_from_a_later_interposer_finds_the_next_definition() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libnext.so");
    let exe = dir.path().join("main");
    cc(INTERPOSER, &lib, &["-shared", "-fPIC", "-ldl"]);
    cc(MAIN, &exe, &["-ldl"]);
    let expected = "getpid ok\nmissing null error-set\nwrite same\n";

    // Without the shim: the reference behaviour.
    let o = Command::new(&exe).env("LD_PRELOAD", &lib).output().unwrap();
    assert_eq!(stdout(&o), expected, "{}", stderr(&o));

    // With the shim first in the chain, exactly the same.
    let preload = format!("{} {}", hook_lib().display(), lib.display());
    let o = Command::new(&exe)
        .env("LD_PRELOAD", &preload)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), expected, "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "the shim says nothing");
}
