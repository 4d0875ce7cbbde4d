//! A binary search over the system call's number in front of a compiled filter.
//!
//! seccompiler compiles a filter into one comparison per call with a rule, in a row: a call
//! without a rule passes all of them before it is refused. The kernel runs a new filter's
//! program once per system call number as it installs it (to learn which calls it allows
//! whatever their arguments, and lets those through later without running it), so that row
//! was walked some 450 times: the process filter took 0.29 ms to install, 0.09 ms with the
//! search (BENCHMARKS.md, seccomp). The search decides in a few comparisons: a call without a
//! rule gets the filter's default action, a call allowed whatever its arguments is allowed, a
//! call refused with an error returns it, and a call whose arguments are checked goes on to the
//! compiled program of those rules.

use seccompiler::{sock_filter, BpfProgram};

/// The architecture value of x86_64 system calls in `seccomp_data` (the kernel's
/// `AUDIT_ARCH_X86_64`: `EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE`).
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// Offsets in `seccomp_data`: the call's number, its architecture.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;

/// Classic BPF operation codes (`linux/bpf_common.h`).
const LOAD_WORD: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JUMP: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const JUMP_IF_EQUAL: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JUMP_IF_AT_LEAST: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const RETURN: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// Calls compared in a row at the search's leaves.
const LEAF_CALLS: usize = 4;

/// What the search does with a call that has a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Allowed whatever its arguments.
    Allow,
    /// Its arguments are checked: the compiled program decides.
    Checked,
    /// Not made: it fails with this action (`SECCOMP_RET_ERRNO` and an errno), whatever its
    /// arguments, and the thread goes on.
    Fail(u32),
}

/// `program` (compiled by seccompiler for x86_64, whose calls without a rule get
/// `otherwise` and whose rules' matches get `allow`) with a search in front of it; `calls`
/// are the numbers of the calls with a rule, and how the search treats each. Another
/// architecture's call goes straight to `program`.
pub fn in_front_of(
    program: BpfProgram,
    calls: &[(i64, Rule)],
    otherwise: u32,
    allow: u32,
) -> BpfProgram {
    let mut calls: Vec<(u32, Rule)> = calls
        .iter()
        .map(|&(call, rule)| (call as u32, rule))
        .collect();
    calls.sort_unstable_by_key(|&(call, _)| call);
    let mut search = SearchWriter {
        code: Vec::with_capacity(4 * calls.len() + program.len()),
        to_program: Vec::new(),
        otherwise,
        allow,
    };
    search.statement(LOAD_WORD, ARCH_OFFSET);
    search
        .code
        .push(jump_if(JUMP_IF_EQUAL, AUDIT_ARCH_X86_64, 1, 0));
    search.jump_to_program();
    search.statement(LOAD_WORD, NR_OFFSET);
    search.node(&calls);
    let start = search.code.len();
    for at in search.to_program {
        search.code[at].k = (start - at - 1) as u32;
    }
    search.code.extend(program);
    search.code
}

/// The search being written.
struct SearchWriter {
    code: Vec<sock_filter>,
    /// Jumps to the compiled program, whose offsets are known once the search is written.
    to_program: Vec<usize>,
    otherwise: u32,
    allow: u32,
}

impl SearchWriter {
    fn statement(&mut self, code: u16, k: u32) {
        self.code.push(sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        });
    }

    fn jump_to_program(&mut self) {
        self.to_program.push(self.code.len());
        self.statement(JUMP, 0);
    }

    /// Decides the calls of `calls` (sorted), the call's number loaded.
    fn node(&mut self, calls: &[(u32, Rule)]) {
        if calls.len() <= LEAF_CALLS {
            for &(call, rule) in calls {
                self.code.push(jump_if(JUMP_IF_EQUAL, call, 0, 1));
                match rule {
                    Rule::Allow => self.statement(RETURN, self.allow),
                    Rule::Checked => self.jump_to_program(),
                    Rule::Fail(action) => self.statement(RETURN, action),
                }
            }
            self.statement(RETURN, self.otherwise);
            return;
        }
        let (below, from) = calls.split_at(calls.len() / 2);
        // At least the middle call: on to the jump over the lower half; else into it.
        self.code.push(jump_if(JUMP_IF_AT_LEAST, from[0].0, 0, 1));
        let over_below = self.code.len();
        self.statement(JUMP, 0);
        self.node(below);
        self.code[over_below].k = (self.code.len() - over_below - 1) as u32;
        self.node(from);
    }
}

fn jump_if(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The fields of `seccomp_data` a filter reads.
    pub struct Call {
        pub nr: u32,
        pub arch: u32,
        pub args: [u64; 6],
    }

    impl Call {
        pub fn x86_64(nr: u32, args: [u64; 6]) -> Self {
            Call {
                nr,
                arch: AUDIT_ARCH_X86_64,
                args,
            }
        }

        fn word(&self, offset: u32) -> u32 {
            match offset {
                0 => self.nr,
                4 => self.arch,
                // The instruction pointer: no filter here reads it.
                16..=63 if offset.is_multiple_of(4) => {
                    let arg = self.args[(offset as usize - 16) / 8];
                    if offset.is_multiple_of(8) {
                        arg as u32
                    } else {
                        (arg >> 32) as u32
                    }
                }
                _ => panic!("a load of seccomp_data at {offset}"),
            }
        }
    }

    /// Runs `program` on `call` as the kernel would: its action, and the instructions run.
    pub fn run(program: &[sock_filter], call: &Call) -> (u32, usize) {
        let (mut pc, mut a, mut steps) = (0usize, 0u32, 0usize);
        loop {
            let op = &program[pc];
            steps += 1;
            let k = op.k;
            let branch = |taken: bool| 1 + usize::from(if taken { op.jt } else { op.jf });
            pc += match op.code {
                LOAD_WORD => {
                    a = call.word(k);
                    1
                }
                code if code == (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16 => {
                    a &= k;
                    1
                }
                JUMP => 1 + k as usize,
                JUMP_IF_EQUAL => branch(a == k),
                JUMP_IF_AT_LEAST => branch(a >= k),
                code if code == (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16 => {
                    branch(a > k)
                }
                RETURN => return (k, steps),
                code => panic!("instruction {code:#x} at {pc}"),
            };
        }
    }

    /// A failure with EACCES.
    const EACCES: u32 = libc::SECCOMP_RET_ERRNO | libc::EACCES as u32;

    fn program_of(calls: &[(i64, Rule)]) -> BpfProgram {
        // A compiled program that answers every call it gets with ERRNO.
        let plain = vec![sock_filter {
            code: RETURN,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO,
        }];
        in_front_of(
            plain,
            calls,
            libc::SECCOMP_RET_TRAP,
            libc::SECCOMP_RET_ALLOW,
        )
    }

    #[test]
    fn every_call_gets_its_rule_s_action_and_calls_without_one_the_default() {
        // Some numbers close together, some far apart, one past the x32 bit.
        let numbers = [
            0,
            1,
            2,
            3,
            5,
            8,
            13,
            16,
            60,
            61,
            202,
            334,
            435,
            439,
            0x4000_0001,
        ];
        for count in 0..=numbers.len() {
            let calls: Vec<(i64, Rule)> = numbers[..count]
                .iter()
                .enumerate()
                .map(|(i, &nr)| {
                    (
                        nr,
                        match i % 4 {
                            0 => Rule::Checked,
                            1 => Rule::Fail(EACCES),
                            _ => Rule::Allow,
                        },
                    )
                })
                .collect();
            let program = program_of(&calls);
            for nr in (0..500).chain([0x4000_0000, 0x4000_0001, u32::MAX]) {
                let expected = match calls.iter().find(|&&(call, _)| call as u32 == nr) {
                    Some((_, Rule::Allow)) => libc::SECCOMP_RET_ALLOW,
                    Some((_, Rule::Checked)) => libc::SECCOMP_RET_ERRNO,
                    Some((_, Rule::Fail(action))) => *action,
                    None => libc::SECCOMP_RET_TRAP,
                };
                let (action, _) = run(&program, &Call::x86_64(nr, [0; 6]));
                assert_eq!(action, expected, "call {nr:#x} of {count} rules");
            }
        }
    }

    #[test]
    fn another_architecture_s_call_goes_to_the_compiled_program() {
        let program = program_of(&[(0, Rule::Allow)]);
        let call = Call {
            nr: 0,
            arch: 0x4000_0003, // AUDIT_ARCH_I386
            args: [0; 6],
        };
        assert_eq!(run(&program, &call).0, libc::SECCOMP_RET_ERRNO);
    }
}
