from tests.asan_drivers import assert_clean_run, run_asan_driver


def test_kv_page_allocator_driver_passes_under_address_sanitizer():
    assert_clean_run(run_asan_driver("test_kv_pages", timeout_s=300), minimum_passed=80)
