//! `strftime_now` in chat templates gives the host's local time, as transformers'
//! `datetime.now().strftime(...)` does. With `TZ` set to a zone 5 h 30 min east of UTC (a
//! POSIX rule, which needs no time-zone database), the rendered time must be the one
//! coreutils' `date` prints under the same `TZ`. A test executable of its own, because it
//! sets the process's environment before anything reads it.

use std::process::Command;

use flm_tests::tokenizer::load;

#[test]
fn strftime_now_is_the_local_time() {
    const TZ: &str = "IST-5:30";
    std::env::set_var("TZ", TZ);
    let template = "{{ strftime_now('%Y-%m-%d %H:%M %a') }}".to_owned();
    let tok = load("stories260K/tok512.model")
        .with_chat_template(Some(template), "test")
        .unwrap();
    let mut seen = Vec::new();
    // The minute may turn between the two reads of the clock: three tries.
    for _ in 0..3 {
        let got = tok.encode_chat(&[], false).unwrap().text;
        let date = Command::new("date")
            .env("TZ", TZ)
            .arg("+%Y-%m-%d %H:%M %a")
            .output()
            .expect("coreutils' date");
        let want = String::from_utf8(date.stdout)
            .unwrap()
            .trim_end()
            .to_owned();
        if got == want {
            return;
        }
        seen.push((got, want));
    }
    panic!("strftime_now against date (flm, date): {seen:?}");
}
