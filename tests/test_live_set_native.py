from tests.asan_drivers import assert_clean_run, run_asan_driver


def test_live_request_table_driver_passes_under_address_sanitizer():
    assert_clean_run(run_asan_driver("test_live_set", timeout_s=300), minimum_passed=15)
