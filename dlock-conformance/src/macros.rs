//! The enrolment macro.

/// Enrols a backend with the capabilities it must declare (`declared = Declared { … }`, the
/// fixed table every scenario checks first): expands to a module `$module` with one test per
/// scenario of [`Scenario::ALL`](crate::Scenario::ALL), plus the ignored `__crash_holder`
/// helper that the crash-release scenario runs in a child process.
///
/// `$factory` is an expression of type `Arc<dyn TestBackend>`, evaluated once per test process
/// (the row's tests share the backend it makes). It may call
/// [`harness_unavailable`](crate::harness_unavailable) to skip when server binaries are missing.
#[macro_export]
macro_rules! conformance_tests {
    ($module:ident, $factory:expr, declared = $declared:expr $(,)?) => {
        #[allow(non_snake_case)]
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            $crate::conformance_tests!(@factory $factory);

            fn __declared() -> $crate::Declared {
                $declared
            }

            $crate::__scenarios!(@tests $module);

            #[test]
            #[ignore = "the soak: cargo xtask conform --soak <duration>"]
            fn __soak() {
                $crate::soak::soak_main(stringify!($module), __factory);
            }
        }
    };
    // A row at production settings: the listed scenarios only, each at `ttl_scale` times its
    // TTL (see `scenarios::run_scaled`).
    (
        $module:ident, $factory:expr, declared = $declared:expr, ttl_scale = $scale:expr,
        only = [$($test:ident => $variant:ident),* $(,)?] $(,)?
    ) => {
        #[allow(non_snake_case)]
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            $crate::conformance_tests!(@factory $factory);

            $(
                #[test]
                fn $test() {
                    $crate::__run_scaled(
                        stringify!($module),
                        $crate::Scenario::$variant,
                        __factory,
                        $declared,
                        $scale,
                    );
                }
            )*

            #[test]
            #[ignore = "the soak: cargo xtask conform --soak <duration>"]
            fn __soak() {
                $crate::soak::soak_main_scaled(stringify!($module), __factory, $scale);
            }
        }
    };
    // Both forms: the row's backend, made once per test process, and the ignored helper the
    // crash-release scenario runs in a child process.
    (@factory $factory:expr) => {
        fn __factory() -> ::std::sync::Arc<dyn $crate::TestBackend> {
            static BACKEND: ::std::sync::OnceLock<::std::sync::Arc<dyn $crate::TestBackend>> =
                ::std::sync::OnceLock::new();
            ::std::sync::Arc::clone(BACKEND.get_or_init(|| $factory))
        }

        #[test]
        #[ignore = "the crash-release scenario runs this in a child process"]
        fn __crash_holder() {
            $crate::scenarios::crash_holder_main(__factory);
        }
    };
    (@tests $module:ident; $($test:ident => $variant:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                $crate::__run(stringify!($module), $crate::Scenario::$variant, __factory, __declared());
            }
        )*
    };
}
