//! The simulated ROCm SMI's answers that need no node: status strings, and calls
//! before `rsmi_init`.

use super::*;

#[test]
fn status_strings_name_their_status() {
    assert!(
        status_text(RSMI_STATUS_SUCCESS)
            .to_str()
            .unwrap()
            .starts_with("RSMI_STATUS_SUCCESS")
    );
    assert!(
        status_text(RSMI_STATUS_FILE_ERROR)
            .to_str()
            .unwrap()
            .contains("file")
    );
    assert_eq!(
        status_text(rsmi_status_t(4242)),
        c"An unknown error occurred"
    );
}

#[test]
fn calls_before_init_are_init_errors() {
    let mut n = 7;
    // SAFETY: a valid out-pointer.
    let r = unsafe { rsmi_num_monitor_devices(&mut n) };
    assert_eq!(r, RSMI_STATUS_INIT_ERROR);
    assert_eq!(n, 7, "nothing written");
    // SAFETY: no arguments.
    let r = unsafe { rsmi_shut_down() };
    assert_eq!(r, RSMI_STATUS_INIT_ERROR);
}

#[test]
fn strings_that_do_not_fit_are_cut_and_say_so() {
    let mut buf = [0x7f as c_char; 4];
    // SAFETY: the buffer's length is passed with it.
    let r = unsafe { put_str(buf.as_mut_ptr(), buf.len(), "MI210") };
    assert_eq!(r, Err(RSMI_STATUS_INSUFFICIENT_SIZE));
    // SAFETY: put_str NUL-terminated within the buffer.
    assert_eq!(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }, c"MI2");
}
